"""Durable task and worker state in SQLite (WAL mode): the embedded default backend.

The rules are in the store's roles (sql.py), the schema in migrations/ (migrate.py). Here: every
state change is atomic in a `BEGIN IMMEDIATE` transaction, so a claim is atomic even when several
scheduler processes share the file; reads run on a connection of their own per thread and never
wait for the write lock (WAL readers see the last commit).

The app makes its state-changing calls on its event loop (`inline`): each takes well under a
millisecond in-process, less than handing it to a thread and back. So one scheduler process per
file: a second process holding the write lock would stall the first one's loop (busy_timeout). For
several scheduler processes, use PostgreSQL.

Group commit (sqlite_group.py): the calls the event loop makes within one turn of it share one
transaction, a savepoint each, made durable by one COMMIT on a thread of its own before any of them
is answered. `_write` guards the write connection (a thread's transaction, or the loop's group).
`_readers` guards the list of read connections, held for an append and nothing else: a read never
waits for a writer, and the loop's first read never waits for its own group.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler.store import migrate
from scheduler.store.lifecycle import HELD, status_in
from scheduler.store.plans import Plan, Read, Step
from scheduler.store.sql import SQLStore
from scheduler.store.sqlite_group import LoopGroup


class SQLiteStore(SQLStore):
    inline = True
    TOKEN_SQL = "lower(hex(randomblob(18)))"  # 144 random bits
    GREATEST = "MAX"
    # Without statistics (no ANALYZE) its planner prefers tasks_status and sorts the whole queue.
    QUEUE_INDEX = " INDEXED BY tasks_queue"
    MODEL_QUEUE_INDEX = " INDEXED BY tasks_model_queue"
    ADAPTER_QUEUE_INDEX = " INDEXED BY tasks_adapter_queue"

    def __init__(self, path: str | Path, busy_timeout_s: float = 10.0, **options: Any) -> None:
        """`busy_timeout_s`: how long a statement waits for the file's lock held by another process."""
        super().__init__(**options)
        self._path = self.location = str(path)
        self._busy_ms = round(busy_timeout_s * 1000)
        self._write = threading.Lock()  # the write connection: a thread's transaction, or the loop's group
        self._readers_lock = threading.Lock()  # the list of read connections, for an append
        self._db = self._connect()
        self._group = LoopGroup(self._db, self._write)  # group commit, from aopen on
        self._db.execute("PRAGMA journal_mode=WAL")
        with self._tx() as db:
            adopt_inline_schema(db)
            migrate.apply(db, "sqlite")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        # Held tasks a client asked to cancel, as this process marked them (one process per file) or
        # found them at open: an exchange's cancel notices read the database only for these.
        self._cancels: set[str] = {r["id"] for r in self._db.execute(CANCELS_HELD).fetchall()}

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        # FULL: a committed claim or result survives an OS crash, not only a process crash.
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        return db

    def _read(self) -> sqlite3.Connection:
        """This thread's read connection: no lock, never behind a writer."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._readers_lock:  # never the write lock: the loop's open group may hold that
                self._readers.append(db)
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self._group.on_loop():  # a call the event loop makes: in the group
            yield from self._group.savepoint()
            return
        with self._write:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` on the event loop; once it wrote, after the COMMIT that makes it durable."""
        if not self._group.on_loop():
            return fn(*args)
        return await self._group.call(fn, *args)

    def _cancel_marked(self, db: sqlite3.Connection, task_id: str) -> None:
        self._cancels.add(task_id)
        if len(self._cancels) > CANCELS_KEPT:
            # Most have ended by now: those still held are kept, read in the marking transaction.
            self._cancels = {r["id"] for r in db.execute(CANCELS_HELD).fetchall()}

    def _may_be_cancelled(self, task_ids: list[str]) -> bool:
        return not self._cancels.isdisjoint(task_ids)

    async def _aread(self, plan: Plan) -> Any:
        """At once, on the calling thread: a read waits for no writer, and on the loop it need not
        wait for the last group's COMMIT either (acall does: a call that writes opens the next
        group). What that group wrote, nobody has been answered yet; the next read sees it."""
        return self._run(plan)

    async def aopen(self) -> None:
        """From here on, the calls this loop makes share transactions (group commit)."""
        await self._group.open()

    async def aclose(self) -> None:
        await self._group.close()

    def _step(self, step: Step) -> list:
        """A plan's read, in the loop's group, sees the writes of the group's earlier calls."""
        if isinstance(step, Read) and self._group.on_loop() and self._group.is_open():
            return self._db.execute(step.sql, step.args).fetchall()
        return super()._step(step)

    def _ids(self, ids: list[str]) -> tuple[str, Any]:
        return "id IN (SELECT value FROM json_each(?))", json.dumps(ids)

    @property
    def group_commits(self) -> int:
        return self._group.commits

    def close(self) -> None:
        """After aclose: waits for a thread's transaction, never for a group (none can be open)."""
        with self._write, self._readers_lock:
            for db in [*self._readers, self._db]:
                db.close()


CANCELS_HELD = f"SELECT id FROM tasks WHERE cancel_requested_at IS NOT NULL AND {status_in(HELD)}"
CANCELS_KEPT = 4096


# The schema before the migrations was written here, applied at open (CREATE ... IF NOT EXISTS),
# with these columns added to files made before them. A file it made may still lack some.
INLINE_ADDED = {
    "tasks": {"cancel_requested_at": "REAL", "webhook": "TEXT", "webhook_due": "REAL",
              "webhook_attempts": "TEXT NOT NULL DEFAULT '[]'"},
    "workers": {"warnings": "TEXT NOT NULL DEFAULT '[]'", "counters": "TEXT NOT NULL DEFAULT '{}'",
                "node_id": "TEXT", "safety_policy": "TEXT", "limits": "TEXT"},
}
INLINE_UNTIL = 6  # the last migration whose changes it had made too
# Its indexes that the migrations make otherwise (partial, as PostgreSQL's always were).
INLINE_INDEXES = ("tasks_queue", "tasks_lease", "tasks_worker")


def adopt_inline_schema(db: sqlite3.Connection) -> None:
    """A file from before the migrations (tables, no schema_migrations) is made what they make: its
    missing columns added as the inline schema did, its indexes those of the migrations, and
    migrations 1 to INLINE_UNTIL recorded as applied. Its data stays as it is."""
    tables = {r["name"] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "tasks" not in tables or "schema_migrations" in tables:
        return
    for table, columns in INLINE_ADDED.items():
        have = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in columns.items():
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
    for index in INLINE_INDEXES:
        db.execute(f"DROP INDEX IF EXISTS {index}")
    db.execute(migrate.TABLE)
    for m in migrate.migrations():
        if m.version <= INLINE_UNTIL:
            for statement in m.statements("sqlite"):
                if statement.startswith("CREATE INDEX "):
                    db.execute(statement.replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1))
            migrate.record(db, m)
