"""The PostgreSQL store's side on the app's event loop (postgres.py): the async pool, the group
commits of submits, claims and report rounds, and the coalesced NOTIFYs that announce new work.

Submits take at most half the async connections, claims and report rounds a quarter each, so that
what empties the queue still gets connections under a flood of submits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from scheduler.store.plans import Plan, Step, Write, WriteEach

log = logging.getLogger(__name__)

CHANNEL = "dit_tasks"


class LoopPool:
    """The async pool, opened on the app's loop, and what writes through it."""

    def __init__(self, url: str, size: int, instance: str) -> None:
        self.url = url
        self.size = size
        self.instance = instance  # its own NOTIFYs are not news to its process
        self.pool = None  # from open to close
        self.intake = self.reports = self.claims = self.announcer = None

    @property
    def opened(self) -> bool:
        return self.pool is not None

    async def open(self) -> None:
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        # Fixed size: a pool growing under a burst makes the burst wait for new connections.
        self.pool = AsyncConnectionPool(self.url, min_size=self.size, max_size=self.size, open=False,
                                        kwargs={"row_factory": dict_row, "autocommit": True})
        await self.pool.open(wait=True, timeout=30)
        # Submits take at most half the connections: under a flood of them, claims and reports (what
        # empties the queue) still find one. Before this, 750 submits/s offered starved them.
        self.intake = GroupCommit(self.pool, slots=max(1, self.size // 2))
        # Report rounds and claims, a quarter each: a batch carries all that arrived meanwhile.
        self.reports = GroupCommit(self.pool, slots=max(1, self.size // 4))
        self.claims = GroupCommit(self.pool, slots=max(1, self.size // 4))
        self.announcer = Announcer(self.pool, self.instance)

    async def close(self) -> None:
        if self.pool is None:
            return
        for batcher in (self.intake, self.claims, self.reports):  # a batch whose callers left is still written
            await batcher.flushed()
        await self.announcer.flushed()
        await self.pool.close()
        self.pool = None

    async def run(self, plan: Plan, step: Step | None = None) -> Any:
        """Each step one round trip on a pooled async connection, no thread hand-offs (through the
        thread pool they cost more than the statements). `step`: the plan's next step, where it was
        started elsewhere."""
        try:
            step = next(plan) if step is None else step
            while True:
                async with self.pool.connection() as conn, conn.cursor() as cur:
                    step = plan.send(await astep(cur, step))
        except StopIteration as done:
            return done.value


class GroupCommit:
    """Writes group-committed (submits' INSERTs; claims' and report rounds' UPDATEs), one batcher
    per kind: those that arrive while its connections are busy go in together, one transaction
    and one round trip (pipelined) per batch, so a flood costs a commit (and a WAL flush) per
    batch rather than per call, and its pace no longer depends on how soon a busy event loop
    resumes each call. At most `slots` batches at once: the rest of the pool is for the other
    calls. A call is answered only once its batch has committed. A batch refused for one row's data
    (an integrity or data error), or chosen as a deadlock's victim, is sent again one step at a
    time, each in its own transaction as before, so that only that step fails."""

    MAX_BATCH = 256

    def __init__(self, pool, slots: int) -> None:
        self._pool = pool  # psycopg_pool's AsyncConnectionPool
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
        async with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
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
            async with self._pool.connection() as conn, conn.cursor() as cur:
                return await astep(cur, step)
        except Exception as e:  # noqa: BLE001 - this call's own error
            return e


class Announcer:
    """NOTIFYs coalesced: the tasks submitted while one NOTIFY is on its way go out together in the
    next (one NOTIFY per submit took PostgreSQL's notify-queue lock at every submit's commit, and
    every other process parsed each). A task is announced only after its commit; a NOTIFY that
    fails is logged, and the other processes' poll_s fallback finds the work."""

    def __init__(self, pool, instance: str) -> None:
        self._pool = pool
        self._instance = instance
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
                async with self._pool.connection() as conn:
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{self._instance}:{n}"))
        except Exception as e:  # noqa: BLE001 - the database away: polling covers the gap
            log.warning("NOTIFY %s failed (%s); other processes find the work by polling", CHANNEL, e)
            self._pending = 0
        finally:
            self._sending = None


async def astep(cur, step) -> list:
    sql = step.sql.replace("?", "%s")
    if not isinstance(step, WriteEach):
        return await (await cur.execute(sql, step.args)).fetchall()
    await cur.executemany(sql, step.args, returning=True)
    rows = []
    while True:  # the async twin of _all_results
        rows += await cur.fetchall() if cur.description else []
        if not cur.nextset():
            return rows
