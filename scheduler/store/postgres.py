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
  together in the next (_Announcer): every scheduler process LISTENs and wakes its own long-polling
  lease requests (at most as many as the tasks), besides their poll_s fallback.
- Submits, claims and report rounds are group-committed (_GroupCommit), each kind apart: those
  that arrive while its connections are busy go in together, one transaction per batch. Submits
  take at most half the async connections, claims and report rounds a quarter each, so that what
  empties the queue still gets connections under a flood of submits.
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

from scheduler.store import migrate
from scheduler.store.plans import Plan, Step, Write, WriteEach
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
        self._intake: _GroupCommit | None = None  # submits
        self._reports: _GroupCommit | None = None  # report rounds
        self._claims: _GroupCommit | None = None
        self._announcer: _Announcer | None = None
        with self._tx() as db:  # schedulers starting together: one applies, the others find it done
            db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATIONS_LOCK,))
            migrate.apply(db, "postgres")
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
        # empties the queue) still find one. Before this, 750 submits/s offered starved them.
        self._intake = _GroupCommit(self, slots=max(1, self._pool_size // 2))
        # Report rounds and claims, a quarter each: a batch carries all that arrived meanwhile.
        self._reports = _GroupCommit(self, slots=max(1, self._pool_size // 4))
        self._claims = _GroupCommit(self, slots=max(1, self._pool_size // 4))
        self._announcer = _Announcer(self)

    async def _aintake(self, plan: Plan) -> Any:
        """A submit's INSERT goes in with the others waiting (_GroupCommit); a step after it (the
        read of a task whose idempotency key was taken) on its own."""
        return await self._grouped(self._intake, plan)

    async def _areports(self, plan: Plan) -> Any:
        return await self._grouped(self._reports, plan)

    async def _aclaims(self, plan: Plan) -> Any:
        """A claim's UPDATE with the others waiting: in one transaction, each sees the rows the
        earlier ones leased as leased, and SKIP LOCKED keeps batches in flight off each other's."""
        return await self._grouped(self._claims, plan)

    async def _grouped(self, batcher: _GroupCommit | None, plan: Plan) -> Any:
        """The plan's first step, a write, group-committed by `batcher`; the steps after it on their own."""
        if self._apool is None or batcher is None:
            return await self._arun(plan)
        try:
            step = next(plan)
            if isinstance(step, (Write, WriteEach)):
                step = plan.send(await batcher.write(step))
        except StopIteration as done:
            return done.value
        return await self._arun(plan, step)

    def _announce(self, n: int) -> None:
        if self._apool is None:  # not on a loop: at once, on a blocking connection
            with self._stmt() as db:
                self._notify(db, n)
            return
        self._announcer.add(n)

    async def aclose(self) -> None:
        for batcher in (self._intake, self._claims, self._reports):
            if batcher is not None:  # a batch whose callers left is still written, then the pool closes
                await batcher.flushed()
        if self._announcer is not None:
            await self._announcer.flushed()
        if self._apool is not None:
            await self._apool.close()
            self._apool = None

    async def _arun(self, plan: Plan, step: Step | None = None) -> Any:
        """A plan on the event loop: each step one round trip on a pooled async connection, no
        thread hand-offs (through the thread pool they cost more than the statements). `step`: the
        plan's next step, where it was started elsewhere."""
        if self._apool is None:  # not opened on a loop (or closed meanwhile): the blocking way
            return await super()._arun(plan if step is None else _resumed(plan, step))
        try:
            step = next(plan) if step is None else step
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


class _GroupCommit:
    """Writes group-committed (submits' INSERTs; claims' and report rounds' UPDATEs), one batcher
    per kind: those that arrive while its connections are busy go in together, one transaction
    and one round trip (pipelined) per batch, so a flood costs a commit (and a WAL flush) per
    batch rather than per call, and its pace no longer depends on how soon a busy event loop
    resumes each call. At most `slots` batches at once: the rest of the pool is for the other
    calls. A call is answered only once its batch has committed. A batch refused for one row's data
    (an integrity or data error), or chosen as a deadlock's victim, is sent again one step at a
    time, each in its own transaction as before, so that only that step fails."""

    MAX_BATCH = 256

    def __init__(self, store: PostgresStore, slots: int) -> None:
        self._store = store
        self._slots = slots
        self._sending: set[asyncio.Task] = set()
        self._starting = False  # a sender made that has not yet taken its batch
        self._waiting: list[tuple[Write | WriteEach, asyncio.Future]] = []
        self.batches = 0  # sent so far (each one transaction)

    async def write(self, step: Write | WriteEach) -> list:
        """`step`'s RETURNING rows (a WriteEach's, of all its statements), once its batch has committed."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((step, done))
        self._start()
        return await done

    async def flushed(self) -> None:
        """Once every batch waiting or being sent has been."""
        while self._sending:
            await asyncio.wait(set(self._sending))

    def _start(self) -> None:
        """A sender for what waits, unless one is about to take it or every slot is busy. The batch
        is taken when the sender runs, at the loop's next turn: the submits of this turn join it."""
        if self._waiting and not self._starting and len(self._sending) < self._slots:
            self._starting = True
            task = asyncio.get_running_loop().create_task(self._send())
            self._sending.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        self._sending.discard(task)
        self._start()

    async def _send(self) -> None:
        self._starting = False
        batch, self._waiting = self._waiting[:self.MAX_BATCH], self._waiting[self.MAX_BATCH:]
        self.batches += 1
        self._start()  # more than a batch waits, and a slot is free
        await self._sent_batch(batch)

    async def _sent_batch(self, batch: list[tuple[Write | WriteEach, asyncio.Future]]) -> None:
        import psycopg

        try:
            steps = [step for step, _ in batch]
            try:
                # A batch of one goes as it did before batching (autocommit: no BEGIN and COMMIT to
                # wait for, no pipeline to set up): what a call costs on a quiet scheduler.
                results = [await self._alone(steps[0])] if len(steps) == 1 else await self._together(steps)
            except (psycopg.errors.IntegrityError, psycopg.errors.DataError, psycopg.errors.DeadlockDetected,
                    psycopg.errors.SerializationFailure):
                results = [await self._alone(step) for step in steps]
            for (_, done), rows in zip(batch, results):
                if done.done():  # its request gone meanwhile: the task is stored all the same
                    continue
                if isinstance(rows, Exception):
                    done.set_exception(rows)
                else:
                    done.set_result(rows)
        except BaseException as e:  # the database away: every call of the batch hears why
            for _, done in batch:
                if not done.done():
                    done.set_exception(e)
            if not isinstance(e, Exception):
                raise

    async def _together(self, steps: list[Write | WriteEach]) -> list[list]:
        """Every step in one transaction, each step's rows apart: one executemany per statement text."""
        by_sql: dict[str, list[tuple[int, tuple]]] = {}
        for i, step in enumerate(steps):
            for args in (step.args if isinstance(step, WriteEach) else [step.args]):
                by_sql.setdefault(step.sql, []).append((i, args))
        out: list[list] = [[] for _ in steps]
        async with self._store._apool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            for sql, calls in by_sql.items():
                await cur.executemany(sql.replace("?", "%s"), [args for _, args in calls], returning=True)
                for i, _ in calls:
                    out[i] += await cur.fetchall() if cur.description else []
                    cur.nextset()
        return out

    async def _alone(self, step: Write | WriteEach) -> list | Exception:
        """`step` in autocommit, as each was sent before batching; its error returned, to be
        answered to its call alone."""
        try:
            async with self._store._apool.connection() as conn, conn.cursor() as cur:
                return await _astep(cur, step)
        except Exception as e:  # noqa: BLE001 - this call's own error
            return e


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


def _resumed(plan: Plan, step: Step) -> Plan:
    """A plan already started, whose next step is `step`, as a plan to run from the start."""
    try:
        while True:
            step = plan.send((yield step))
    except StopIteration as done:
        return done.value


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
