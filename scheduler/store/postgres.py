"""The store on PostgreSQL (psycopg 3, psycopg_pool): for fleets, with several scheduler processes
behind a load balancer sharing one database and coordinating through it alone.

- The rules are in the store's roles (sql.py). A claim's inner SELECT takes `FOR UPDATE SKIP
  LOCKED`, so concurrent claims never wait on, or take, each other's rows; a report locks its
  task's row (its UPDATE, or a failure's locked read).
- The schema comes from the numbered files in migrations/ (migrate.py, as for SQLite), applied at
  start under an advisory lock (schedulers starting together apply each once).
- The request path's hot calls (submit, claim, reports) run on the app's event loop through
  psycopg's async pool (each step one round trip; a round's reports pipelined by executemany); the
  others use the blocking pool from the app's thread pool. Pool connections are in autocommit.
- New work is announced with NOTIFY after commit, the submits made while one NOTIFY is on its way
  together in the next (postgres_loop.Announcer): every scheduler process LISTENs and wakes its own long-polling
  lease requests (at most as many as the tasks), besides their poll_s fallback.
- Submits, claims and report rounds are group-committed (postgres_loop.py), each kind apart: those
  that arrive while its connections are busy go in together, one transaction per batch.
- Maintenance runs in whichever process takes the advisory lock first; the others skip that round.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from scheduler.store import migrate
from scheduler.store.plans import Plan, Step, Write, WriteEach
from scheduler.store.postgres_loop import CHANNEL, GroupCommit, LoopPool
from scheduler.store.sql import SQLStore

log = logging.getLogger(__name__)

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
        self._hot = LoopPool(url, pool_size, self.instance)  # the async pool and its group commits, opened on the loop
        with self._tx() as db:  # schedulers starting together: one applies, the others find it done
            db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATIONS_LOCK,))
            migrate.apply(db, "postgres")
        self._listener = _Listener(url, self.instance)

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
        self._listener.stop()
        self._pool.close()

    async def aopen(self) -> None:
        await self._hot.open()

    async def _aintake(self, plan: Plan) -> Any:
        """A submit's INSERT with the others waiting; a step after it (a taken idempotency key's read) alone."""
        return await self._grouped(self._hot.intake, plan)

    async def _areports(self, plan: Plan) -> Any:
        return await self._grouped(self._hot.reports, plan)

    async def _aclaims(self, plan: Plan) -> Any:
        """A claim's UPDATE with the others waiting: in one transaction, each sees the rows the
        earlier ones leased as leased, and SKIP LOCKED keeps batches in flight off each other's."""
        return await self._grouped(self._hot.claims, plan)

    async def _grouped(self, batcher: GroupCommit | None, plan: Plan) -> Any:
        """The plan's first step, a write, group-committed by `batcher`; the steps after it on their own."""
        if not self._hot.opened or batcher is None:
            return await self._arun(plan)
        try:
            step = next(plan)
            if isinstance(step, (Write, WriteEach)):
                step = plan.send(await batcher.write(step))
        except StopIteration as done:
            return done.value
        return await self._arun(plan, step)

    def _announce(self, n: int) -> None:
        if self._hot.opened:
            return self._hot.announcer.add(n)
        with self._stmt() as db:  # not on a loop: at once, on a blocking connection
            self._notify(db, n)

    async def aclose(self) -> None:
        await self._hot.close()  # what waits is still written, then the pool closes

    async def _arun(self, plan: Plan, step: Step | None = None) -> Any:
        """A plan on the event loop, each step one round trip on a pooled async connection (LoopPool).
        `step`: the plan's next step, where it was started elsewhere."""
        if not self._hot.opened:  # not opened on a loop (or closed meanwhile): the blocking way
            return await super()._arun(plan if step is None else _resumed(plan, step))
        return await self._hot.run(plan, step)

    # ------------------------------------------------------------ start-up and wake-ups

    def listen(self, on_work: Callable[[int], None]) -> None:
        """Calls on_work(n) when another scheduler process announces n tasks; on a thread of its own."""
        self._listener.start(on_work)


class _Listener:
    """LISTEN on its own connection and thread: another process's NOTIFY wakes this one's lease
    requests. The database restarting: it listens again; polling covers the gap."""

    def __init__(self, url: str, instance: str) -> None:
        self.url = url
        self.instance = instance
        self._stop = threading.Event()

    def start(self, on_work: Callable[[int], None]) -> None:
        threading.Thread(target=self._listen, args=(on_work,), name="pg-listen", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

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


def _resumed(plan: Plan, step: Step) -> Plan:
    """A plan already started, whose next step is `step`, as a plan to run from the start."""
    try:
        while True:
            step = plan.send((yield step))
    except StopIteration as done:
        return done.value


def _all_results(cur) -> list:
    """The rows of every statement an executemany(returning=True) ran (already received)."""
    rows = []
    while True:
        rows += cur.fetchall() if cur.description else []
        if not cur.nextset():
            return rows
