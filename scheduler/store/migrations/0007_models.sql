-- Several models on one fleet (scheduler config [models]). The model each task is made with (NULL
-- on a fleet that does not route by model), each model's queue in lease order (a claim reads the
-- head of each model a worker serves, whatever the other models' backlog), and what each worker
-- holds resident and can load, as it last said.
ALTER TABLE tasks ADD COLUMN model TEXT;
CREATE INDEX tasks_model_queue ON tasks (model, priority DESC, seq) WHERE status = 'queued';
CREATE TABLE worker_models (
    worker_id TEXT NOT NULL,
    model TEXT NOT NULL,
    resident INTEGER NOT NULL,
    since DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (worker_id, model)
);
CREATE INDEX worker_models_model ON worker_models (model, resident);
