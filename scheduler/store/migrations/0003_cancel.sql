-- Cancellation: when a client asked to cancel a leased or processing task (the worker learns it
-- from its heartbeat reply; the task ends `cancelled`, never `succeeded`).
ALTER TABLE tasks ADD COLUMN cancel_requested_at DOUBLE PRECISION;
