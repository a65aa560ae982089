"""The store on PostgreSQL (psycopg 3, psycopg_pool): for fleets, with several scheduler processes
behind a load balancer sharing one database and coordinating through it alone.

- The rules are in the store's roles (sql.py). A claim's inner SELECT takes `FOR UPDATE SKIP
  LOCKED`, so concurrent claims never wait on, or take, each other's rows; a report locks its
  task's row (its UPDATE, or a failure's locked read).
- The schema comes from the numbered files in migrations/ (schema.py, as for SQLite), applied at
  start under an advisory lock (schedulers starting together apply each once).
- The request path's hot calls (submit, claim, reports) run on the app's event loop through
  psycopg's async pool (each step one round trip; a round's reports pipelined by executemany); the
  others use the blocking pool from the app's thread pool. Pool connections are in autocommit.
- New work is announced with NOTIFY after commit, the submits made while one NOTIFY is on its way
  together in the next (_Announcer): every scheduler process LISTENs and wakes its own long-polling
  lease requests (at most as many as the tasks), besides their poll_s fallback. Submits take at most
  half the async connections, so that claims and reports still get theirs under a flood.
- Maintenance runs in whichever process takes the advisory lock first; the others skip that round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from scheduler.store import schema
from scheduler.store.plans import Plan, WriteEach
from scheduler.store.sql import SQLStore

log = logging.getLogger(__name__)

CHANNEL = "dit_tasks"
MIGRATIONS_LOCK = 7_305_001  # advisory lock keys, arbitrary but fixed
MAINTENANCE_LOCK = 7_305_002


class _Adapted:
    """A psycopg connection that takes the shared SQL's `?` placeholders."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def execute(self, sql: str, args: tuple = ()):
        return self._conn.execute(sql.replace("?", "%s"), args)


class PostgresStore(SQLStore):
    WANTS_STARTED = "strpos(webhook, '\"started\"') > 0"
    TOKEN_SQL = "replace(gen_random_uuid()::text, '-', '')"  # 122 random bits
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    LOCK_ROW = " FOR UPDATE"
    GREATEST = "GREATEST"

    def __init__(self, url: str, pool_size: int = 4, **options: Any) -> None:
        """`pool_size`: connections in each of its two pools (async for the hot calls, blocking for
        the rest). A few serve thousands of statements a second from the event loop (4 carried the
        benchmark's 1,250 lifecycles/s as well as 16); each more is a database backend competing for
        its CPUs."""
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        super().__init__(**options)
        self.url = self.location = url
        self.instance = uuid.uuid4().hex[:12]  # its own NOTIFYs are not news to this process
        # Autocommit: a read or a lone statement is one round trip; transactions are explicit blocks.
        self._pool = ConnectionPool(url, min_size=2, max_size=pool_size,
                                    kwargs={"row_factory": dict_row, "autocommit": True}, open=False)
        self._pool.open(wait=True, timeout=30)
        self._pool_size = pool_size
        self._apool = None  # the async pool, opened on the app's loop (aopen)
        self._intake: asyncio.Semaphore | None = None
        self._announcer: _Announcer | None = None
        with self._tx() as db:  # schedulers starting together: one applies, the others find it done
            db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATIONS_LOCK,))
            schema.apply(db, "postgres")
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------ hooks

    @contextmanager
    def _tx(self) -> Iterator[_Adapted]:
        with self._pool.connection() as conn, conn.transaction():
            yield _Adapted(conn)

    @contextmanager
    def _stmt(self) -> Iterator[_Adapted]:
        with self._pool.connection() as conn:  # autocommit: the statement is its own transaction
            yield _Adapted(conn)

    def _read(self) -> Any:
        return _PooledRead(self._pool)

    def _ids(self, ids: list[str]) -> tuple[str, Any]:
        return "id = ANY(?)", list(ids)

    def _each(self, db: _Adapted, sql: str, args: list[tuple]) -> list:
        with db._conn.cursor() as cur:  # executemany pipelines the statements: one round trip
            cur.executemany(sql.replace("?", "%s"), args, returning=True)
            return _all_results(cur)

    def _notify(self, db: Any, n: int) -> None:
        if n > 0:
            db.execute("SELECT pg_notify(?, ?)", (CHANNEL, f"{self.instance}:{n}"))

    def _announced(self, insert: str) -> str:
        # A data-modifying CTE always runs; the SELECT over its rows sends one NOTIFY per task made
        # (none when the INSERT yielded to an idempotency key). The payload is this process's id.
        return f"WITH made AS ({insert}) SELECT made.*, pg_notify('{CHANNEL}', '{self.instance}:1') AS notified FROM made"

    def _maintenance_lock(self, db: Any) -> bool:
        return db.execute("SELECT pg_try_advisory_xact_lock(?) AS ok", (MAINTENANCE_LOCK,)).fetchone()["ok"]

    def close(self) -> None:
        self._stop.set()
        self._pool.close()

    async def aopen(self) -> None:
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        # Fixed size: a pool growing under a burst makes the burst wait for new connections.
        self._apool = AsyncConnectionPool(self.url, min_size=self._pool_size, max_size=self._pool_size, open=False,
                                          kwargs={"row_factory": dict_row, "autocommit": True})
        await self._apool.open(wait=True, timeout=30)
        # Submits take at most half the connections: under a flood of them, claims and reports (what
        # drains the queue) still find one. Before this, 750 submits/s offered starved the drain.
        self._intake = asyncio.Semaphore(max(1, self._pool_size // 2))
        self._announcer = _Announcer(self)

    async def _aintake(self, plan: Plan) -> Any:
        if self._apool is None:
            return await self._arun(plan)
        async with self._intake:
            return await self._arun(plan)

    def _announce(self, n: int) -> None:
        if self._apool is None:  # not on a loop: at once, on a blocking connection
            with self._stmt() as db:
                self._notify(db, n)
            return
        self._announcer.add(n)

    async def aclose(self) -> None:
        if self._announcer is not None:
            await self._announcer.flushed()
        if self._apool is not None:
            await self._apool.close()
            self._apool = None

    async def _arun(self, plan: Plan) -> Any:
        """A plan on the event loop: each step one round trip on a pooled async connection, no
        thread hand-offs (through the thread pool they cost more than the statements)."""
        if self._apool is None:  # not opened on a loop: the blocking way
            return await super()._arun(plan)
        try:
            step = next(plan)
            while True:
                async with self._apool.connection() as conn, conn.cursor() as cur:
                    step = plan.send(await _astep(cur, step))
        except StopIteration as done:
            return done.value

    # ------------------------------------------------------------ start-up and wake-ups

    def listen(self, on_work: Callable[[int], None]) -> None:
        """Calls on_work(n) when another scheduler process announces n tasks; on a thread of its own."""
        self._listener = threading.Thread(target=self._listen, args=(on_work,), name="pg-listen", daemon=True)
        self._listener.start()

    def _listen(self, on_work: Callable[[int], None]) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            sender, _, n = note.payload.partition(":")
                            if sender != self.instance:
                                on_work(int(n))
            except Exception as e:  # the database restarting: listen again; polling covers the gap
                if not self._stop.is_set():
                    log.warning("LISTEN %s failed (%s); retrying in 1 s", CHANNEL, e)
                    self._stop.wait(1.0)


class _Announcer:
    """NOTIFYs coalesced: the tasks submitted while one NOTIFY is on its way go out together in the
    next (one NOTIFY per submit took PostgreSQL's notify-queue lock at every submit's commit, and
    every other process parsed each). A task is announced only after its commit; a NOTIFY that
    fails is logged, and the other processes' poll_s fallback finds the work."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._pending = 0
        self._sending: asyncio.Task | None = None

    def add(self, n: int) -> None:
        self._pending += n
        if self._sending is None:
            self._sending = asyncio.get_running_loop().create_task(self._send())

    async def flushed(self) -> None:
        if self._sending is not None:
            await self._sending

    async def _send(self) -> None:
        try:
            while self._pending:
                n, self._pending = self._pending, 0
                async with self._store._apool.connection() as conn:
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{self._store.instance}:{n}"))
        except Exception as e:  # noqa: BLE001 - the database away: polling covers the gap
            log.warning("NOTIFY %s failed (%s); other processes find the work by polling", CHANNEL, e)
            self._pending = 0
        finally:
            self._sending = None


class _PooledRead:
    """A read: one pooled connection per statement, its short transaction ended at once."""

    def __init__(self, pool) -> None:
        self._pool = pool

    def execute(self, sql: str, args: tuple = ()):
        with self._pool.connection() as conn:
            return _Fetched(conn.execute(sql.replace("?", "%s"), args).fetchall())


class _Fetched:
    def __init__(self, rows: list) -> None:
        self._rows = rows

    def fetchall(self) -> list:
        return self._rows

    def fetchone(self):
        return self._rows[0] if self._rows else None

    def __iter__(self):
        return iter(self._rows)


async def _astep(cur, step) -> list:
    sql = step.sql.replace("?", "%s")
    if not isinstance(step, WriteEach):
        return await (await cur.execute(sql, step.args)).fetchall()
    await cur.executemany(sql, step.args, returning=True)
    rows = []
    while True:  # the async twin of _all_results
        rows += await cur.fetchall() if cur.description else []
        if not cur.nextset():
            return rows


def _all_results(cur) -> list:
    """The rows of every statement an executemany(returning=True) ran (already received)."""
    rows = []
    while True:
        rows += cur.fetchall() if cur.description else []
        if not cur.nextset():
            return rows
