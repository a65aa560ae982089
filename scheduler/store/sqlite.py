"""Durable task and worker state in SQLite (WAL mode): the embedded default backend.

Every state change is one `BEGIN IMMEDIATE` transaction, so a claim is atomic even when several
scheduler processes share the file. Reads run on a connection of their own per thread and never
wait for the write lock (WAL readers see the last commit). Expired leases and silent workers are
dealt with by `sweep`, which the app runs periodically, never inside a request; until then a lease
past its deadline is already refused to its holder (reports and renewals check the deadline).
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

HELD = "status IN ('leased', 'processing')"
HELD_ROW = "id, attempts, max_attempts, error, worker_id"


class SQLiteStore:
    def __init__(
        self,
        path: str | Path,
        *,
        lease_ttl_s: float = 60.0,
        max_attempts: int = 3,
        liveness_s: float = 90.0,
        retention_s: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.max_attempts = max_attempts
        self.liveness_s = liveness_s  # a worker silent this long is lost; its tasks go back
        self.retention_s = retention_s  # lost and replaced registrations are kept this long
        self._clock = clock
        self._path = str(path)
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

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection: no lock, never behind a writer."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._lock:
                self._readers.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            for db in [*self._readers, self._db]:
                db.close()

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
        return task_view(_get(self._reader(), task_id))

    def list(self, status: str | None, limit: int, offset: int) -> list[TaskView]:
        if status:
            rows = self._reader().execute("SELECT * FROM tasks WHERE status = ? ORDER BY seq LIMIT ? OFFSET ?",
                                          (status, limit, offset)).fetchall()
        else:
            rows = self._reader().execute("SELECT * FROM tasks ORDER BY seq LIMIT ? OFFSET ?",
                                          (limit, offset)).fetchall()
        return [task_view(r) for r in rows]

    def queued_count(self) -> int:
        return self._reader().execute("SELECT COUNT(*) FROM tasks WHERE status = 'queued'").fetchone()[0]

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
        return sum(self._retire(db, worker_id, "replaced", ErrorCode.WORKER_RESTARTED,
                                f"worker {worker_id} restarted (node {node_id} registered again as {new_id})", now)
                   for worker_id in old)

    def _retire(self, db: sqlite3.Connection, worker_id: str, status: str, code: ErrorCode, why: str,
                now: float) -> int:
        """Marks a registration `replaced` or `lost` and requeues what it held; the tasks requeued."""
        db.execute("UPDATE workers SET status = ?, in_flight = '[]' WHERE id = ?", (status, worker_id))
        rows = db.execute(f"SELECT {HELD_ROW} FROM tasks WHERE worker_id = ? AND {HELD}", (worker_id,)).fetchall()
        for row in rows:
            self._requeue_held(db, row, code, why, now)
        return len(rows)

    def workers(self) -> list[WorkerView]:
        rows = self._reader().execute("SELECT * FROM workers ORDER BY registered_at").fetchall()
        now = self._clock()
        return [worker_view(r, now) for r in rows]

    def claim(self, worker_id: str, max_tasks: int) -> list[Lease]:
        """Atomically lease up to `max_tasks` queued tasks, highest priority first, then FIFO: one
        UPDATE ... RETURNING. Tokens are 144 random bits from SQLite's randomblob (fencing tokens:
        a report also needs the worker's id and bearer token)."""
        now = self._clock()
        deadline = leases.deadline(now, self.lease_ttl_s)
        with self._tx() as db:
            _require_worker(db, worker_id)
            rows = db.execute(
                "UPDATE tasks SET status = 'leased', attempts = attempts + 1, worker_id = ?,"
                " lease_token = lower(hex(randomblob(18))), lease_deadline = ?, updated_at = ?"
                " WHERE id IN (SELECT id FROM tasks WHERE status = 'queued' ORDER BY priority DESC, seq LIMIT ?)"
                " RETURNING id, input, created_at, lease_token, attempts, priority, seq",
                (worker_id, deadline, now, max_tasks)).fetchall()
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        return [Lease(task_id=r["id"], input=json.loads(r["input"]), created_at=r["created_at"],
                      lease_token=r["lease_token"], lease_deadline=deadline, lease_ttl_s=self.lease_ttl_s,
                      attempt=r["attempts"]) for r in rows]

    def heartbeat(self, worker_id: str, hb: Heartbeat) -> HeartbeatReply:
        """Records the worker's state and renews, in one UPDATE, the leases it still holds on its
        in-flight tasks; the others are `lost`."""
        now = self._clock()
        deadline = leases.deadline(now, self.lease_ttl_s)
        with self._tx() as db:
            _require_worker(db, worker_id)
            db.execute(
                # A replaced registration stays replaced: its group is gone or about to be.
                "UPDATE workers SET status = CASE WHEN status = 'replaced' THEN status ELSE ? END, in_flight = ?,"
                " last_heartbeat = ?, warnings = ?, counters = ? WHERE id = ?",
                (hb.status, json.dumps(hb.in_flight), now, json.dumps(hb.warnings), json.dumps(hb.counters),
                 worker_id),
            )
            renewed = {r["id"] for r in db.execute(
                f"UPDATE tasks SET lease_deadline = ?, updated_at = ? WHERE worker_id = ? AND {HELD}"
                " AND lease_deadline >= ? AND id IN (SELECT value FROM json_each(?)) RETURNING id",
                (deadline, now, worker_id, now, json.dumps(hb.in_flight)))}
        return HeartbeatReply(renewed={t: deadline for t in hb.in_flight if t in renewed},
                              lost=[t for t in hb.in_flight if t not in renewed])

    def report(self, task_id: str, rep: Report) -> TaskView:
        """Applies a worker's report if, and only if, it carries the task's current lease token."""
        now = self._clock()
        with self._tx() as db:
            row = _get(db, task_id)
            if (row["status"] not in ("leased", "processing") or row["lease_token"] is None
                    or not secrets.compare_digest(row["lease_token"], rep.lease_token)
                    or row["worker_id"] != rep.worker_id or row["lease_deadline"] < now):
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
        """Maintenance, run periodically by the app: requeues what expired leases and lost workers
        held, and prunes old registrations. The number of tasks requeued or failed."""
        now = self._clock()
        with self._tx() as db:
            moved = self._expire(db, now) + self._lose_silent(db, now)
            db.execute("DELETE FROM workers WHERE status IN ('lost', 'replaced')"
                       " AND COALESCE(last_heartbeat, registered_at) < ?", (now - self.retention_s,))
        return moved

    # ------------------------------------------------------------ internals

    def _expire(self, db: sqlite3.Connection, now: float) -> int:
        """Tasks whose lease expired go back to the queue, or fail when out of attempts. A lease is
        held up to and including its deadline; strictly after it, it is gone."""
        rows = db.execute(f"SELECT {HELD_ROW} FROM tasks WHERE {HELD} AND lease_deadline < ?", (now,)).fetchall()
        for row in rows:
            self._requeue_held(db, row, ErrorCode.LEASE_EXPIRED, f"worker {row['worker_id']} lost the lease", now)
        return len(rows)

    def _lose_silent(self, db: sqlite3.Connection, now: float) -> int:
        """Workers without a heartbeat for liveness_s are `lost`; what they held goes back now,
        well before the lease TTL. A lost worker that beats again is shown as it says it is."""
        silent = [r["id"] for r in db.execute(
            "SELECT id FROM workers WHERE status NOT IN ('lost', 'replaced')"
            " AND COALESCE(last_heartbeat, registered_at) < ?", (now - self.liveness_s,))]
        return sum(self._retire(db, worker_id, "lost", ErrorCode.WORKER_LOST,
                                f"worker {worker_id} sent no heartbeat for {self.liveness_s:g}s", now)
                   for worker_id in silent)

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
