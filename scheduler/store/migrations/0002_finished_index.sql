-- Queue figures count the tasks that ended in the last minutes.
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
