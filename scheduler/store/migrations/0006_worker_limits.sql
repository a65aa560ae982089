-- What each worker accepts in a task's input (protocol WorkerLimits, as JSON; NULL: it did not say),
-- from its registration: submissions no live worker could serve are refused. Statuses are free text
-- (no CHECK), so the new `drained` status needs no change here.
ALTER TABLE workers ADD COLUMN limits TEXT;
