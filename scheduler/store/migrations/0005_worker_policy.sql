-- The version of the prompt policy's lists each worker checks with, from its heartbeats.
ALTER TABLE workers ADD COLUMN safety_policy TEXT;
