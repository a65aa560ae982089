-- Webhooks: a task may name a URL called when it ends (and optionally when it starts). The final
-- statements set webhook_due in the same UPDATE as the status, so no event is lost on a crash; the
-- dispatcher claims due rows, delivers, and records each attempt.
ALTER TABLE tasks ADD COLUMN webhook TEXT;
ALTER TABLE tasks ADD COLUMN webhook_due DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN webhook_attempts TEXT NOT NULL DEFAULT '[]';
CREATE INDEX tasks_webhook_due ON tasks (webhook_due) WHERE webhook_due IS NOT NULL;
