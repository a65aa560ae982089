-- The schema, version 1, for SQLite and PostgreSQL alike (in PostgreSQL's words: schema.py).
-- JSON is held as text.
CREATE TABLE tasks (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    input TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    worker_id TEXT,
    lease_token TEXT,
    lease_deadline DOUBLE PRECISION,
    result TEXT,
    error TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION
);
-- The queue, in lease order; only queued rows, so claims stay fast however many tasks have ended.
CREATE INDEX tasks_queue ON tasks (priority DESC, seq) WHERE status = 'queued';
CREATE INDEX tasks_held ON tasks (lease_deadline) WHERE status IN ('leased', 'processing');
CREATE INDEX tasks_worker ON tasks (worker_id) WHERE status IN ('leased', 'processing');
CREATE INDEX tasks_status ON tasks (status, seq);

CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    status TEXT NOT NULL,
    in_flight TEXT NOT NULL DEFAULT '[]',
    registered_at DOUBLE PRECISION NOT NULL,
    last_heartbeat DOUBLE PRECISION,
    warnings TEXT NOT NULL DEFAULT '[]',
    counters TEXT NOT NULL DEFAULT '{}',
    node_id TEXT
);
CREATE INDEX workers_node ON workers (node_id);
