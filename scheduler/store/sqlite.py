"""Durable task and worker state in SQLite (WAL mode): the embedded default backend.

Every state change is one `BEGIN IMMEDIATE` transaction, so a claim is atomic even when several
scheduler processes share the file. Expired leases are swept at the start of each transaction that
reads leases, so no caller ever sees a lease that has run out.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from scheduler import leases
from scheduler.store.base import Conflict, NotFound, task_view, worker_view
from protocol import (
    ErrorCode,
    ErrorEnvelope,
    Heartbeat,
    HeartbeatReply,
    Lease,
    RegisterWorker,
    Report,
    SubmitTask,
    TaskView,
    WorkerView,
)

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
    counters TEXT NOT NULL DEFAULT '{}'
);
"""

# Columns added after the first release, with their definitions: added to older databases at open.
MIGRATIONS = {
    "workers": {"warnings": "TEXT NOT NULL DEFAULT '[]'", "counters": "TEXT NOT NULL DEFAULT '{}'",
                "node_id": "TEXT"},
}
INDEXES = ["CREATE INDEX IF NOT EXISTS workers_node ON workers (node_id)",
           "CREATE INDEX IF NOT EXISTS tasks_worker ON tasks (worker_id, status)"]

LEASED = ("leased", "processing")


class SQLiteStore:
    def __init__(
        self,
        path: str | Path,
        *,
        lease_ttl_s: float = 60.0,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.max_attempts = max_attempts
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed claim or result survives an OS crash, not only a process crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.executescript(SCHEMA)
        _migrate(self._db)
        for index in INDEXES:
            self._db.execute(index)

    def close(self) -> None:
        with self._lock:
            self._db.close()

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

    # ------------------------------------------------------------ clients

    def submit(self, req: SubmitTask) -> tuple[TaskView, bool]:
        """Returns (task, created). A repeated idempotency key returns the first task."""
        now = self._clock()
        body = json.dumps(req.input, sort_keys=True)
        with self._tx() as db:
            if req.idempotency_key is not None:
                row = db.execute(
                    "SELECT * FROM tasks WHERE idempotency_key = ?", (req.idempotency_key,)
                ).fetchone()
                if row is not None:
                    if json.loads(row["input"]) != req.input or row["priority"] != req.priority:
                        raise Conflict(f"idempotency_key {req.idempotency_key!r} was used with another body")
                    return task_view(row), False
            task_id = uuid.uuid4().hex
            db.execute(
                "INSERT INTO tasks (id, idempotency_key, input, priority, status, max_attempts,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?)",
                (task_id, req.idempotency_key, body, req.priority,
                 req.max_attempts or self.max_attempts, now, now),
            )
            return task_view(_get(db, task_id)), True

    def get(self, task_id: str) -> TaskView:
        with self._tx() as db:
            self._sweep(db)
            return task_view(_get(db, task_id))

    def list(self, status: str | None, limit: int, offset: int) -> list[TaskView]:
        with self._tx() as db:
            self._sweep(db)
            where, args = ("WHERE status = ?", [status]) if status else ("", [])
            rows = db.execute(
                f"SELECT * FROM tasks {where} ORDER BY seq LIMIT ? OFFSET ?", [*args, limit, offset]
            ).fetchall()
            return [task_view(r) for r in rows]

    def queued_count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM tasks WHERE status = 'queued'").fetchone()[0]

    # ------------------------------------------------------------ workers

    def register(self, req: RegisterWorker) -> tuple[str, int]:
        """(worker id, tasks requeued). A registration naming a node replaces that node's earlier
        registrations: their group restarted, so the tasks they held go back now, not at lease expiry."""
        worker_id = f"w-{uuid.uuid4().hex[:12]}"
        now = self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO workers (id, info, status, registered_at, node_id) VALUES (?, ?, 'initializing', ?, ?)",
                (worker_id, req.model_dump_json(exclude={"node_id"}), now, req.node_id),
            )
            requeued = self._replace(db, req.node_id, worker_id, now) if req.node_id else 0
        return worker_id, requeued

    def _replace(self, db: sqlite3.Connection, node_id: str, new_id: str, now: float) -> int:
        old = [r["id"] for r in db.execute(
            "SELECT id FROM workers WHERE node_id = ? AND id != ? AND status != 'replaced'", (node_id, new_id))]
        rows = []
        for worker_id in old:
            db.execute("UPDATE workers SET status = 'replaced', in_flight = '[]' WHERE id = ?", (worker_id,))
            rows += db.execute("SELECT id, attempts, max_attempts, error, worker_id FROM tasks"
                               " WHERE worker_id = ? AND status IN ('leased', 'processing')", (worker_id,)).fetchall()
        for row in rows:
            self._requeue_held(db, row, ErrorCode.WORKER_RESTARTED,
                               f"worker {row['worker_id']} restarted (node {node_id} registered again as {new_id})",
                               now)
        return len(rows)
    def workers(self) -> list[WorkerView]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM workers ORDER BY registered_at").fetchall()
        return [worker_view(r) for r in rows]

    def claim(self, worker_id: str, max_tasks: int) -> list[Lease]:
        """Atomically lease up to `max_tasks` queued tasks, highest priority first, then FIFO."""
        now = self._clock()
        with self._tx() as db:
            _require_worker(db, worker_id)
            self._sweep(db)
            rows = db.execute(
                "SELECT * FROM tasks WHERE status = 'queued' ORDER BY priority DESC, seq LIMIT ?",
                (max_tasks,),
            ).fetchall()
            out = []
            for row in rows:
                token = secrets.token_urlsafe(24)
                dl = leases.deadline(now, self.lease_ttl_s)
                db.execute(
                    "UPDATE tasks SET status = 'leased', attempts = attempts + 1, worker_id = ?,"
                    " lease_token = ?, lease_deadline = ?, updated_at = ? WHERE id = ?",
                    (worker_id, token, dl, now, row["id"]),
                )
                out.append(Lease(task_id=row["id"], input=json.loads(row["input"]), created_at=row["created_at"],
                                 lease_token=token,
                                 lease_deadline=dl, lease_ttl_s=self.lease_ttl_s,
                                 attempt=row["attempts"] + 1))
            return out

    def heartbeat(self, worker_id: str, hb: Heartbeat) -> HeartbeatReply:
        """Records the worker's state and renews the leases it still holds on its in-flight tasks."""
        now = self._clock()
        with self._tx() as db:
            _require_worker(db, worker_id)
            self._sweep(db)
            db.execute(
                # A replaced registration stays replaced: its group is gone or about to be.
                "UPDATE workers SET status = CASE WHEN status = 'replaced' THEN status ELSE ? END, in_flight = ?,"
                " last_heartbeat = ?, warnings = ?, counters = ? WHERE id = ?",
                (hb.status, json.dumps(hb.in_flight), now, json.dumps(hb.warnings), json.dumps(hb.counters),
                 worker_id),
            )
            renewed, lost = {}, []
            for task_id in hb.in_flight:
                dl = leases.deadline(now, self.lease_ttl_s)
                cur = db.execute(
                    f"UPDATE tasks SET lease_deadline = ?, updated_at = ? WHERE id = ? AND worker_id = ?"
                    f" AND status IN {LEASED}",
                    (dl, now, task_id, worker_id),
                )
                if cur.rowcount:
                    renewed[task_id] = dl
                else:
                    lost.append(task_id)
            return HeartbeatReply(renewed=renewed, lost=lost)

    def report(self, task_id: str, rep: Report) -> TaskView:
        """Applies a worker's report if, and only if, it carries the task's current lease token."""
        now = self._clock()
        with self._tx() as db:
            self._sweep(db)
            row = _get(db, task_id)
            if (row["status"] not in LEASED or row["lease_token"] is None
                    or not secrets.compare_digest(row["lease_token"], rep.lease_token)
                    or row["worker_id"] != rep.worker_id):
                raise Conflict(f"lease on task {task_id} is not held by this token (status {row['status']})")
            if rep.status == "processing":
                db.execute(
                    "UPDATE tasks SET status = 'processing', lease_deadline = ?, updated_at = ?,"
                    " started_at = COALESCE(started_at, ?) WHERE id = ?",
                    (leases.deadline(now, self.lease_ttl_s), now, now, task_id),
                )
            elif rep.status == "released":
                # Leased but never started (the worker is going down): back in the queue, and the
                # attempt does not count. The last error, if any, is kept.
                db.execute(
                    "UPDATE tasks SET status = 'queued', attempts = MAX(attempts - 1, 0), lease_token = NULL,"
                    " lease_deadline = NULL, updated_at = ? WHERE id = ?", (now, task_id))
            elif rep.status == "succeeded":
                db.execute(
                    "UPDATE tasks SET status = 'succeeded', result = ?, error = NULL, lease_token = NULL,"
                    " lease_deadline = NULL, updated_at = ?, finished_at = ? WHERE id = ?",
                    (rep.result.model_dump_json(), now, now, task_id),
                )
            else:
                assert rep.error is not None
                error = rep.error.model_copy(update={"worker_id": rep.worker_id})
                nxt = leases.after_failure(error.retryable, row["attempts"], row["max_attempts"])
                self._release(db, task_id, nxt, error, now)
            return task_view(_get(db, task_id))

    def sweep(self) -> int:
        with self._tx() as db:
            return self._sweep(db)

    # ------------------------------------------------------------ internals

    def _sweep(self, db: sqlite3.Connection) -> int:
        """Puts tasks whose lease expired back in the queue, or fails them when out of attempts. A
        lease is held up to and including its deadline; strictly after it, it is gone."""
        now = self._clock()
        rows = db.execute(
            f"SELECT id, attempts, max_attempts, error, worker_id FROM tasks"
            f" WHERE status IN {LEASED} AND lease_deadline < ?", (now,)
        ).fetchall()
        for row in rows:
            self._requeue_held(db, row, ErrorCode.LEASE_EXPIRED, f"worker {row['worker_id']} lost the lease", now)
        return len(rows)

    def _requeue_held(self, db: sqlite3.Connection, row: sqlite3.Row, code: ErrorCode, why: str, now: float) -> None:
        """A held task whose worker is gone: queued again while attempts remain (the lost attempt
        counts, so a task that kills its workers does not loop forever), else failed with `code`."""
        last = f"; last error: {json.loads(row['error'])['message']}" if row["error"] else ""
        error = ErrorEnvelope(code=code, retryable=True, worker_id=row["worker_id"],
                              message=f"{why} (attempt {row['attempts']} of {row['max_attempts']}){last}")
        nxt = leases.after_expiry(row["attempts"], row["max_attempts"])
        self._release(db, row["id"], nxt, error if nxt == "failed" else None, now)

    @staticmethod
    def _release(db: sqlite3.Connection, task_id: str, nxt: str, error: ErrorEnvelope | None,
                 now: float) -> None:
        # A requeued task keeps its last error for diagnosis; it is replaced by the next outcome.
        db.execute(
            "UPDATE tasks SET status = ?, error = COALESCE(?, error), lease_token = NULL,"
            " lease_deadline = NULL, updated_at = ?, finished_at = ? WHERE id = ?",
            (nxt, error.model_dump_json() if error else None, now,
             now if nxt == "failed" else None, task_id),
        )


def _get(db: sqlite3.Connection, task_id: str) -> sqlite3.Row:
    row = db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row


def _migrate(db: sqlite3.Connection) -> None:
    for table, columns in MIGRATIONS.items():
        have = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in columns.items():
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")


def _require_worker(db: sqlite3.Connection, worker_id: str) -> None:
    if db.execute("SELECT 1 FROM workers WHERE id = ?", (worker_id,)).fetchone() is None:
        raise NotFound(f"no worker {worker_id}; register first")
