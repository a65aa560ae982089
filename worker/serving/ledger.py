"""Rank 0's ledger of the tasks it holds: each attempt's stage, the stage's deadline and the
attempt's fate, from admission to its final report; and the worker's counters.

Everyone else tells it (the task moved on, the scheduler says this lease is lost, this one was
reported) or asks it (was it cancelled? is what it produces dropped? which leases to renew?); none
keeps a set or a flag of its own. A fate changes only here, under one lock, along TRANSITIONS:
anything else raises IllegalTransition.

Attempts are held by identity: a task id that comes back in a later lease is a new hold, the earlier
attempt is lost to it, and the earlier attempt's late calls cannot end the new one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from weakref import WeakKeyDictionary

from protocol import ErrorCode
from worker.config import DeadlinesConfig
from worker.serving.task import Task


class Stage(StrEnum):
    """Where a held task is. Each stage has its own deadline, the [deadlines] field `field`."""

    def __new__(cls, value: str, field: str) -> "Stage":
        stage = str.__new__(cls, value)
        stage._value_ = value
        stage.field = field
        return stage

    ADMIT = "admit", "admit_s"  # validation, text check, `processing` report
    FETCH = "fetch", "fetch_s"  # its adapters downloaded into the node's cache (then its `processing` report)
    READY = "ready", "stall_s"  # admitted, waiting for a round: only a stuck serve loop leaves it there
    SWAP = "swap", "swap_s"  # its round waits for its model to be loaded on every rank
    GENERATE = "generate", "generate_s"
    CHECK = "check", "check_s"
    ENCODE = "encode", "encode_s"
    STORE = "store", "store_s"
    REPORT = "report", "report_s"  # post stage over; waits for earlier tasks' reports, then its own

    @property
    def started(self) -> bool:
        """Past admission and the wait for a round: giving it back costs the task an attempt."""
        return self not in (Stage.ADMIT, Stage.FETCH, Stage.READY, Stage.SWAP)


def stage_limits(deadlines: DeadlinesConfig) -> dict[Stage, float]:
    return {stage: getattr(deadlines, stage.field) for stage in Stage}


class Fate(Enum):
    LIVE = "live"  # held and moving: its lease is renewed while its stage is within its deadline
    CANCELLED = "cancelled"  # a client cancelled it: never stored, or its result removed; reported `cancelled`
    LOST = "lost"  # the scheduler says its lease is gone, or a newer attempt holds the task: dropped
    OVERDUE = "overdue"  # its stage passed its deadline: no longer renewed; the watchdog fails it for a retry
    ABANDONED = "abandoned"  # the serve loop stalled: given back before the process exits
    DONE = "done"  # reported, or dropped: nothing more happens to it


# Every legal change of fate. An attempt is held LIVE; DONE is the end of every path.
TRANSITIONS: dict[Fate, frozenset[Fate]] = {
    Fate.LIVE: frozenset({Fate.CANCELLED, Fate.LOST, Fate.OVERDUE, Fate.ABANDONED, Fate.DONE}),
    # The cancellation outranks a lost lease (the result is removed, the report says `cancelled`)
    # but not a newer attempt, which owns the task.
    Fate.CANCELLED: frozenset({Fate.LOST, Fate.OVERDUE, Fate.ABANDONED, Fate.DONE}),
    Fate.LOST: frozenset({Fate.CANCELLED, Fate.OVERDUE, Fate.ABANDONED, Fate.DONE}),
    Fate.OVERDUE: frozenset({Fate.ABANDONED, Fate.DONE}),
    Fate.ABANDONED: frozenset({Fate.DONE}),
    Fate.DONE: frozenset(),
}
RENEWED = frozenset({Fate.LIVE, Fate.CANCELLED, Fate.LOST})  # still moving: renewed within the deadline
DROPPED = frozenset({Fate.LOST, Fate.OVERDUE, Fate.ABANDONED, Fate.DONE})  # what it produces is not reported


class IllegalTransition(RuntimeError):
    """A change of fate outside TRANSITIONS: a bug in the caller, never a state of the world."""

    def __init__(self, task: Task, was: Fate | None, to: Fate) -> None:
        super().__init__(f"task {task.id} attempt {task.lease.attempt}: "
                         f"{was.value if was else 'not held'} -> {to.value} is not a transition")


class Counter(StrEnum):
    """The heartbeat's counters by their wire names (GET /v1/workers, the status page, /metrics)."""

    IMAGES_GENERATED = "images_generated"  # by every rank of the group, for tasks
    CORRUPT_OUTPUTS = "corrupt_outputs"
    PROMPTS_REFUSED = "prompts_refused"
    IMAGES_REFUSED = "images_refused"
    TASKS_SUCCEEDED = "tasks_succeeded"
    TASKS_FAILED = "tasks_failed"
    TASKS_RELEASED = "tasks_released"
    TASKS_CANCELLED = "tasks_cancelled"
    LEASES_LOST = "leases_lost"
    HEARTBEAT_FAILURES = "heartbeat_failures"
    REPORTS = "reports"
    REPORT_US_TOTAL = "report_us_total"
    SWAPS = "swaps"  # models loaded after start, on every rank (a failed load counts too)
    # Gauges: set, not added to.
    LEASE_AHEAD = "lease_ahead"
    MAX_PENDING = "max_pending"
    PEAK_MEMORY_MB = "peak_memory_mb"
    UNREPORTED_MAX = "unreported_max"  # a high-water mark


# A delivered final report's status -> what it counts.
REPORTED = {"succeeded": Counter.TASKS_SUCCEEDED, "failed": Counter.TASKS_FAILED,
            "released": Counter.TASKS_RELEASED}
FAILED_PREFIX = "failed."  # the wire name of the count of failures per error code: failed.<code>


class Tally:
    """The worker's counters, typed: totals since it started, gauges, and failures by error code. A
    counter is on the wire once first touched (even by 0), as it always was."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Counter, int] = {}
        self._failed: dict[ErrorCode, int] = {}

    def add(self, counter: Counter, n: int = 1) -> None:
        self._update(counter, lambda old: old + n)

    def set(self, counter: Counter, value: int) -> None:
        self._update(counter, lambda old: value)

    def high_water(self, counter: Counter, value: int) -> None:
        self._update(counter, lambda old: max(old, value))

    def failed(self, code: ErrorCode) -> None:
        code = ErrorCode(code)
        with self._lock:
            self._failed[code] = self._failed.get(code, 0) + 1

    def get(self, counter: Counter) -> int:
        with self._lock:
            return self._counts.get(counter, 0)

    def failures(self) -> dict[ErrorCode, int]:
        with self._lock:
            return dict(self._failed)

    def as_wire(self) -> dict[str, int]:
        """The heartbeat's `counters`."""
        with self._lock:
            return {**{c.value: n for c, n in self._counts.items()},
                    **{f"{FAILED_PREFIX}{code.value}": n for code, n in self._failed.items()}}

    def _update(self, counter: Counter, change: Callable[[int], int]) -> None:
        if not isinstance(counter, Counter):
            raise TypeError(f"counters are named by Counter, not {counter!r}")
        with self._lock:
            self._counts[counter] = change(self._counts.get(counter, 0))


@dataclass(eq=False)
class Held:
    """One attempt as the ledger holds it. Read it; only the ledger changes it."""

    task: Task
    stage: Stage
    limit_s: float
    deadline: float  # time.monotonic()
    fate: Fate = Fate.LIVE
    lease_lost: bool = False  # the scheduler said so: counted once, whatever the fate


class Ledger:
    def __init__(self, limits: Mapping[Stage, float] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._limits = dict(limits if limits is not None else stage_limits(DeadlinesConfig()))
        self._held: dict[str, Held] = {}  # the attempt held of each task, until it ends
        self._attempts: WeakKeyDictionary[Task, Held] = WeakKeyDictionary()  # every attempt held, ended too
        self.counters = Tally()

    # ------------------------------------------------------------ told

    def hold(self, task: Task, stage: Stage = Stage.ADMIT) -> None:
        """Held from now on: its lease is renewed while `stage` is within its deadline."""
        with self._lock:
            if (held := self._attempts.get(task)) is not None:
                raise IllegalTransition(task, held.fate, Fate.LIVE)
            if (earlier := self._held.get(task.id)) is not None and earlier.fate in (Fate.LIVE, Fate.CANCELLED):
                self._move(earlier, Fate.LOST)  # a newer attempt owns the task
            limit = self._limits[stage]
            self._held[task.id] = self._attempts[task] = Held(task, stage, limit, self._clock() + limit)

    def advance(self, task: Task, stage: Stage) -> None:
        """The task moved on: a new stage with its own deadline (unless it no longer moves)."""
        with self._lock:
            if (held := self._current(task)) is not None and held.fate in RENEWED:
                held.stage, held.limit_s = stage, self._limits[stage]
                held.deadline = self._clock() + held.limit_s

    def mark_lost(self, task_ids: Iterable[str]) -> None:
        """The scheduler no longer renews these leases. A cancellation, a deadline or a stall already
        decided the fate of some: they keep it, but the lost lease is counted all the same."""
        fresh = 0
        with self._lock:
            for held in filter(None, map(self._held.get, task_ids)):
                if not held.lease_lost:
                    held.lease_lost, fresh = True, fresh + 1
                    if held.fate is Fate.LIVE:
                        self._move(held, Fate.LOST)
        self.counters.add(Counter.LEASES_LOST, fresh)

    def mark_cancelled(self, task_ids: Iterable[str]) -> list[str]:
        """A client cancelled these: dropped or discarded from now on. Returns those newly cancelled."""
        with self._lock:
            fresh = [h for h in filter(None, map(self._held.get, task_ids)) if h.fate in (Fate.LIVE, Fate.LOST)]
            for held in fresh:
                self._move(held, Fate.CANCELLED)
        return sorted(h.task.id for h in fresh)

    def overdue(self) -> list[Held]:
        """Attempts whose stage has just passed its deadline, now OVERDUE; each is returned once."""
        now = self._clock()
        with self._lock:
            late = [h for h in self._held.values() if h.fate in RENEWED and now > h.deadline]
            for held in late:
                self._move(held, Fate.OVERDUE)
        return late

    def abandon_all(self) -> list[Held]:
        """The serve loop stalled: every attempt still held is ABANDONED, to be given back."""
        with self._lock:
            held = [h for h in self._held.values() if Fate.ABANDONED in TRANSITIONS[h.fate]]
            for h in held:
                self._move(h, Fate.ABANDONED)
        return held

    def end(self, task: Task) -> None:
        """Reported, or dropped: no longer held. A late second call, or one for an attempt never
        held, changes nothing."""
        with self._lock:
            if (held := self._attempts.get(task)) is None or held.fate is Fate.DONE:
                return
            self._move(held, Fate.DONE)
            if self._held.get(task.id) is held:
                del self._held[task.id]

    # ------------------------------------------------------------ asked

    def fate(self, task: Task) -> Fate | None:
        """None: this attempt was never held."""
        with self._lock:
            held = self._attempts.get(task)
            return held.fate if held is not None else None

    def cancelled(self, task: Task) -> bool:
        return self.fate(task) is Fate.CANCELLED

    def dropped(self, task: Task) -> bool:
        """What this attempt produces from now on is neither stored nor reported: its lease is lost,
        a deadline or a stall failed it, it ended, or another attempt of the task is held."""
        with self._lock:
            held = self._attempts.get(task)
            return task.id in self._held if held is None else held.fate in DROPPED

    def in_flight(self) -> list[str]:
        """The leases the next heartbeat renews: attempts still moving, within their stage's deadline."""
        now = self._clock()
        with self._lock:
            return sorted(t for t, h in self._held.items() if h.fate in RENEWED and now <= h.deadline)

    def held(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    # ------------------------------------------------------------ under the lock

    def _current(self, task: Task) -> Held | None:
        held = self._held.get(task.id)
        return held if held is not None and held.task is task else None

    def _move(self, held: Held, to: Fate) -> None:
        if to not in TRANSITIONS[held.fate]:
            raise IllegalTransition(held.task, held.fate, to)
        held.fate = to
