"""Durable task and worker state in SQLite (WAL mode): the embedded default backend.

The rules are in sql.py. Here: every state change is one `BEGIN IMMEDIATE` transaction, so a claim
is atomic even when several scheduler processes share the file; reads run on a connection of their
own per thread and never wait for the write lock (WAL readers see the last commit).

The app makes its state-changing calls on its event loop (`inline`): each takes well under a
millisecond in-process, less than handing it to a thread and back. So one scheduler process per
file: a second process holding the write lock would stall the first one's loop (busy_timeout). For
several scheduler processes, use PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler.store.sql import SQLStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    input TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    worker_id TEXT,
    lease_token TEXT,
    lease_deadline REAL,
    result TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS tasks_queue ON tasks (status, priority DESC, seq);
CREATE INDEX IF NOT EXISTS tasks_lease ON tasks (status, lease_deadline);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    status TEXT NOT NULL,
    in_flight TEXT NOT NULL DEFAULT '[]',
    registered_at REAL NOT NULL,
    last_heartbeat REAL,
    warnings TEXT NOT NULL DEFAULT '[]',
    counters TEXT NOT NULL DEFAULT '{}',
    safety_policy TEXT
);
"""

# Columns added after the first release, with their definitions: added to older databases at open.
MIGRATIONS = {
    "tasks": {"cancel_requested_at": "REAL", "webhook": "TEXT", "webhook_due": "REAL",
              "webhook_attempts": "TEXT NOT NULL DEFAULT '[]'"},
    "workers": {"warnings": "TEXT NOT NULL DEFAULT '[]'", "counters": "TEXT NOT NULL DEFAULT '{}'",
                "node_id": "TEXT", "safety_policy": "TEXT", "limits": "TEXT"},
}
INDEXES = ["CREATE INDEX IF NOT EXISTS workers_node ON workers (node_id)",
           "CREATE INDEX IF NOT EXISTS tasks_worker ON tasks (worker_id, status)",
           "CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL",
           "CREATE INDEX IF NOT EXISTS tasks_webhook_due ON tasks (webhook_due) WHERE webhook_due IS NOT NULL"]


class SQLiteStore(SQLStore):
    inline = True
    TOKEN_SQL = "lower(hex(randomblob(18)))"  # 144 random bits
    GREATEST = "MAX"

    def __init__(self, path: str | Path, **options: Any) -> None:
        super().__init__(**options)
        self._path = self.location = str(path)
        self._lock = threading.Lock()
        self._db = self._connect()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        _migrate(self._db)
        for index in INDEXES:
            self._db.execute(index)
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        # FULL: a committed claim or result survives an OS crash, not only a process crash.
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=10000")
        return db

    def _read(self) -> sqlite3.Connection:
        """This thread's read connection: no lock, never behind a writer."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._lock:
                self._readers.append(db)
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _ids(self, ids: list[str]) -> tuple[str, Any]:
        return "id IN (SELECT value FROM json_each(?))", json.dumps(ids)

    def close(self) -> None:
        with self._lock:
            for db in [*self._readers, self._db]:
                db.close()


def _migrate(db: sqlite3.Connection) -> None:
    for table, columns in MIGRATIONS.items():
        have = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in columns.items():
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
