-- LoRA adapters routed as models are (a task's input.loras): each task's set of adapters by name
-- (protocol.adapter_set_key; '' for none), the queue of those sets' tasks in lease order (a claim
-- reads the tasks of the sets a worker holds first), and the sets each worker holds loaded, as it
-- last said or as a claim gave it them.
ALTER TABLE tasks ADD COLUMN adapters TEXT NOT NULL DEFAULT '';
CREATE INDEX tasks_adapter_queue ON tasks (adapters, priority DESC, seq) WHERE status = 'queued' AND adapters <> '';
CREATE TABLE worker_adapters (
    worker_id TEXT NOT NULL,
    adapters TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (worker_id, adapters)
);
CREATE INDEX worker_adapters_set ON worker_adapters (adapters);
