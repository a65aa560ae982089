"""What the store's roles share: the database. Its connections and transactions are hooks that the
dialect classes (sqlite.py, postgres.py) override, and nothing else; here, plans are carried out on
them (PlanRunner), the settings every role reads are kept, and what was reclaimed is counted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from protocol import TaskView
from scheduler.store.base import Unknown, task_view
from scheduler.store.plans import Plan, Read, Step, WriteEach, drive
from scheduler.store.routing import Route


class ReclaimTally:
    """Held tasks this process took back, by (reason code, "queued", "failed" or "cancelled"): for
    /metrics. Added to by whichever thread reclaims, read by the scrape."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, code: str, outcome: str) -> None:
        with self._lock:
            self._counts[(code, outcome)] += 1

    def copy(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return self._counts.copy()

    def __getitem__(self, key: tuple[str, str]) -> int:
        return self.copy()[key]


class PlanRunner:
    """How a store carries out its plans (scheduler.store.plans): each step atomic on its own
    (`_run`), every step in one transaction (`_run_in`), or from the event loop (`_arun`, and the
    hooks where a backend may commit several callers' steps together). The Database below provides
    the handles."""

    _stmt: Callable[[], AbstractContextManager[Any]]
    _read: Callable[[], Any]
    _each: Callable[..., list]
    acall: Callable[..., Any]

    def _run(self, plan: Plan) -> Any:
        """A plan whose steps are each atomic on their own."""
        return drive(plan, self._step)

    def _step(self, step: Step) -> list:
        if isinstance(step, WriteEach):
            with self._stmt() as db:
                return self._each(db, step.sql, step.args)
        if isinstance(step, Read):
            return self._read().execute(step.sql, step.args).fetchall()
        with self._stmt() as db:
            return db.execute(step.sql, step.args).fetchall()

    def _run_in(self, db: Any, plan: Plan) -> Any:
        """A plan with every step on `db`, inside its transaction: a row read locked stays locked."""
        return drive(plan, lambda step: self._each(db, step.sql, step.args) if isinstance(step, WriteEach)
                     else db.execute(step.sql, step.args).fetchall())

    async def _arun(self, plan: Plan) -> Any:
        return await self.acall(self._run, plan)

    async def _aread(self, plan: Plan) -> Any:
        """A plan that only reads: _arun, where the backend may run it at once (SQLite: on the
        loop, without waiting for the COMMIT in flight; it reads the last commit)."""
        return await self._arun(plan)

    async def _aintake(self, plan: Plan) -> Any:
        """A plan that lets new work in (a submit): _arun, where the backend may hold it back so
        that the calls that empty the queue (claims, reports) are not starved under a flood."""
        return await self._arun(plan)

    async def _areports(self, plan: Plan) -> Any:
        """A round of reports whose first step (its UPDATEs) the backend may commit together with
        other rounds' (PostgreSQL); _arun elsewhere."""
        return await self._arun(plan)

    async def _aclaims(self, plan: Plan) -> Any:
        """A claim whose UPDATE the backend may commit together with other claims' (PostgreSQL);
        _arun elsewhere."""
        return await self._arun(plan)


class Database(PlanRunner):
    """Subclasses provide `_tx()` (a write transaction yielding a handle with `execute(sql, args)`),
    `_read()` (a read handle), `_ids()` and `close()`, and the dialect fragments below."""

    TOKEN_SQL = ""  # an expression making a fresh random lease token per row
    SKIP_LOCKED = ""  # appended to the claim's inner SELECT
    LOCK_ROW = ""  # appended to a SELECT of a row about to change
    QUEUE_INDEX = ""  # appended to `FROM tasks` where the queue is read in its order
    MODEL_QUEUE_INDEX = ""  # likewise, where one model's queue is
    ADAPTER_QUEUE_INDEX = ""  # likewise, where the queue of tasks with adapters is
    GREATEST = "MAX"  # the two-argument maximum
    WANTS_STARTED = "instr(webhook, '\"started\"') > 0"  # the webhook asks for the started event
    inline = False  # True: in-process and short, called on the app's event loop instead of a thread
    location = ""  # the file or URL it was opened on

    def __init__(self, *, lease_ttl_s: float = 60.0, max_attempts: int = 3, liveness_s: float = 90.0,
                 worker_retention_s: float = 86400.0, task_retention_s: float = 7 * 86400.0,
                 models: Sequence[str] = (), default_model: str = "", cold_wait_s: float = 10.0,
                 route: Route = "affinity", adapter_wait_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.max_attempts = max_attempts
        self.liveness_s = liveness_s  # a worker silent this long is lost; its tasks go back
        self.worker_retention_s = worker_retention_s  # lost, replaced and drained registrations are kept this long
        self.task_retention_s = task_retention_s  # ended tasks are kept this long (expires_at), then removed
        # The fleet's models (config [models]): none, and tasks carry no model and any worker takes
        # any task; else each task names one, and claims route (routing.py).
        self.models = frozenset(models)
        self.default_model = (default_model or models[0]) if models else None  # a task naming none
        self.cold_wait_s = cold_wait_s
        self.route = route
        self.adapter_wait_s = adapter_wait_s  # how long a task waits for the worker holding its adapters
        self.clock = clock
        self.reclaimed = ReclaimTally()

    def view(self, row: Any) -> TaskView:
        return task_view(row, self.task_retention_s)

    # ------------------------------------------------------------ dialect hooks

    def _tx(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _read(self) -> Any:
        raise NotImplementedError

    def _stmt(self) -> AbstractContextManager[Any]:
        """A handle for one statement that is atomic on its own. PostgreSQL: outside a transaction
        block, so BEGIN and COMMIT cost no round trips."""
        return self._tx()

    def _ids(self, ids: list[str]) -> tuple[str, Any]:
        """A condition `id` in `ids`, and its one parameter."""
        raise NotImplementedError

    def _each(self, db: Any, sql: str, args: list[tuple]) -> list:
        return [row for one in args for row in db.execute(sql, one).fetchall()]

    def _cancel_marked(self, db: Any, task_id: str) -> None:
        """A client asked to cancel `task_id` while a worker holds it: its cancel_requested_at set in
        `db`'s transaction, under way."""

    def _may_be_cancelled(self, task_ids: list[str]) -> bool:
        """False only when none of `task_ids` can carry a cancel request: its read can be skipped.
        Here always True (other processes may mark them)."""
        return True

    def _notify(self, db: Any, n: int) -> None:
        """Tells other scheduler processes that n tasks may be waiting (at commit)."""

    def _announced(self, insert: str) -> str:
        """An INSERT ... RETURNING that also tells other scheduler processes of each task it made,
        in the same statement (at its commit)."""
        return insert

    def _maintenance_lock(self, db: Any) -> bool:
        """False when another process is running maintenance right now."""
        return True

    def _announce(self, n: int) -> None:
        """From the event loop, after the commit: n tasks were made (other processes may be told
        later, together with others)."""

    # ------------------------------------------------------------ lifecycle

    def ping(self) -> None:
        """One round trip to the database: raises when it cannot be reached."""
        self._read().execute("SELECT 1 AS one").fetchone()

    def close(self) -> None:
        raise NotImplementedError

    async def aopen(self) -> None:
        """Opens what the async calls need, on the app's event loop."""

    async def aclose(self) -> None:
        pass

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One of this store's blocking calls, from the event loop: made there when `inline`
        (SQLite: in-process and short, cheaper than two thread hand-offs), else on a thread."""
        if self.inline:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)


def task_row(db: Any, task_id: str, lock: str = "") -> Any:
    row = db.execute(f"SELECT * FROM tasks WHERE id = ?{lock}", (task_id,)).fetchone()
    if row is None:
        raise Unknown(f"no task {task_id}")
    return row
