"""Durable task and worker state in SQLite (WAL mode): the embedded default backend.

The rules are in the store's roles (sql.py), the schema in migrations/ (migrate.py). Here: every
state change is atomic in a `BEGIN IMMEDIATE` transaction, so a claim is atomic even when several
scheduler processes share the file; reads run on a connection of their own per thread and never
wait for the write lock (WAL readers see the last commit).

The app makes its state-changing calls on its event loop (`inline`): each takes well under a
millisecond in-process, less than handing it to a thread and back. So one scheduler process per
file: a second process holding the write lock would stall the first one's loop (busy_timeout). For
several scheduler processes, use PostgreSQL.

Group commit. synchronous=FULL makes every COMMIT an fsync, and under a fleet's load (four
transactions per task) the fsyncs were a third of the scheduler's time. So the calls the event loop
makes within one turn of it share one transaction: the first opens it, each call is a SAVEPOINT in
it (atomic on its own: a call that fails undoes only itself), and one COMMIT, at the loop's next
turn, makes them all durable at once. No call returns before that COMMIT: an answer a client gets
is on disk. The busier the loop, the more calls share an fsync.

The COMMIT runs on a thread of its own: its fsync (some 0.4 ms on an SSD, up to a sixth of the loop's
time under a fleet's load) no longer stops the event loop, which parses, admits and answers other
requests meanwhile. Store calls made during it wait for it and then form the next group together.

Locks (docs/architecture.md, "Threads, locks and the event loop"). `_write` guards the write
connection: a thread holds it for its own transaction; the loop's group holds it from its BEGIN
until the committer thread's COMMIT, across turns of the loop. So the loop thread takes it only to
open a group (never while its own group is open), and nothing else ever waits for it on the loop.
`_readers` guards the list of read connections, held for an append and nothing else: a read never
waits for a writer, and the loop's first read never waits for its own group.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler.store import migrate
from scheduler.store.plans import Read, Step
from scheduler.store.sql import SQLStore


class SQLiteStore(SQLStore):
    inline = True
    TOKEN_SQL = "lower(hex(randomblob(18)))"  # 144 random bits
    GREATEST = "MAX"
    # Without statistics (no ANALYZE) its planner prefers tasks_status and sorts the whole queue.
    QUEUE_INDEX = " INDEXED BY tasks_queue"
    MODEL_QUEUE_INDEX = " INDEXED BY tasks_model_queue"

    def __init__(self, path: str | Path, busy_timeout_s: float = 10.0, **options: Any) -> None:
        """`busy_timeout_s`: how long a statement waits for the file's lock held by another process."""
        super().__init__(**options)
        self._path = self.location = str(path)
        self._busy_ms = round(busy_timeout_s * 1000)
        self._write = threading.Lock()  # the write connection: a thread's transaction, or the loop's group
        self._readers_lock = threading.Lock()  # the list of read connections, for an append
        # Group commit (aopen): the loop whose calls share transactions, the open group's future.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._group: asyncio.Future | None = None
        self._joined: asyncio.Future | None = None
        self._committing: asyncio.Future | None = None  # the last group's COMMIT, on the committer thread
        self._committer: ThreadPoolExecutor | None = None
        self.group_commits = 0
        self._db = self._connect()
        self._db.execute("PRAGMA journal_mode=WAL")
        with self._tx() as db:
            adopt_inline_schema(db)
            migrate.apply(db, "sqlite")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []

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
        if self._loop_thread == threading.get_ident():  # a call the event loop makes: in the group
            yield from self._in_group()
            return
        with self._write:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _in_group(self) -> Iterator[sqlite3.Connection]:
        """A savepoint in the loop's open group transaction (opened here if none is)."""
        if self._group is None:
            # Held until the group commits: threads' transactions wait for it. Free, or held by a
            # thread's transaction or the last group's COMMIT (acall waited for that), both of which
            # end without the loop.
            self._write.acquire()
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self._write.release()
                raise
            self._group = self._loop.create_future()
            self._loop.call_soon(self._commit_group)
        self._joined = self._group
        self._db.execute("SAVEPOINT call")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK TO call")
            self._db.execute("RELEASE call")
            raise
        self._db.execute("RELEASE call")

    def _commit_group(self) -> None:
        """At the loop's turn after the group opened: its COMMIT, handed to the committer thread."""
        group, self._group = self._group, None
        self._committing = done = self._loop.run_in_executor(self._committer, self._commit)
        done.add_done_callback(lambda f: self._committed(f, group))  # before any waiter's: they resume after

    def _commit(self) -> None:
        """On the committer thread. The lock, held since the group's BEGIN, is released before the
        loop hears of it: the next group can open as soon as it resumes."""
        try:
            self._db.execute("COMMIT")
        except BaseException:  # the disk full or gone: every call of the group fails
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        finally:
            self._write.release()

    def _committed(self, done: asyncio.Future, group: asyncio.Future) -> None:
        if self._committing is done:
            self._committing = None
        if (error := done.exception()) is not None:
            group.set_exception(error)
        else:
            group.set_result(None)
            self.group_commits += 1

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` on the event loop; once it wrote, after the COMMIT that makes it durable."""
        if self._loop_thread != threading.get_ident():
            return fn(*args)
        while (prior := self._committing) is not None:  # not raised here: the prior group's failure is its own
            await asyncio.wait({prior})
        self._joined = None
        result = fn(*args)
        group, self._joined = self._joined, None
        if group is not None:
            await asyncio.shield(group)  # a cancelled request does not cancel the others' commit
        return result

    async def aopen(self) -> None:
        """From here on, the calls this loop makes share transactions (group commit)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="sqlite-commit")

    async def aclose(self) -> None:
        while (pending := self._group or self._committing) is not None:  # an open group, a COMMIT in flight
            await asyncio.wait({pending})
        self._loop_thread = None
        if self._committer is not None:
            self._committer.shutdown()
            self._committer = None

    def _step(self, step: Step) -> list:
        """A plan's read, in the loop's group, sees the writes of the group's earlier calls."""
        if isinstance(step, Read) and self._loop_thread == threading.get_ident() and self._group is not None:
            return self._db.execute(step.sql, step.args).fetchall()
        return super()._step(step)

    def _ids(self, ids: list[str]) -> tuple[str, Any]:
        return "id IN (SELECT value FROM json_each(?))", json.dumps(ids)

    def close(self) -> None:
        """After aclose: waits for a thread's transaction, never for a group (none can be open)."""
        with self._write, self._readers_lock:
            for db in [*self._readers, self._db]:
                db.close()


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
