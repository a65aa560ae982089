"""Rank 0's heartbeat: a daemon thread that never waits on the GPU.

It reports the worker's status, in-flight task ids, warnings and counters every interval, which renews
their leases on the scheduler, but only for tasks whose stage is within its deadline: a task that
stopped moving is not kept alive. The reply names leases this worker has lost, so their results are
not reported.
A status change (e.g. to "ready") is sent at once rather than at the next tick. At the end of a
clean drain, `farewell` stops the thread and sends the last heartbeat, status "drained".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from protocol import Heartbeat, WorkerStatus
from worker.serving.queue_client import AuthError, NotFound, QueueClient, QueueError
from worker.serving.task import Task

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Held:
    """A task this worker holds a lease on: the stage it is in and that stage's deadline."""

    task: Task
    stage: str
    limit_s: float
    deadline: float  # time.monotonic()
    overdue: bool = False  # past its deadline; the watchdog fails it


class WorkerState:
    """What rank 0 is doing, shared between the serve loop, the intake, the post pool, the heartbeat
    and the watchdog. Tasks are held by identity: a task id that comes back in a later lease is a new
    hold, and the earlier attempt's late calls cannot end it."""

    def __init__(self, warnings: list[str] = (), clock: Callable[[], float] = time.monotonic,
                 safety_policy: str | None = None) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._status: WorkerStatus = "initializing"
        self._held: dict[str, Held] = {}
        self._lost: set[str] = set()
        self._cancelled: set[str] = set()  # a client cancelled them: dropped, reported `cancelled`
        self._counters: dict[str, int] = {}
        self._progress = clock()
        self._storage_failing = False
        self.warnings = list(warnings)  # set once at start, e.g. a safety check switched off
        self.safety_policy = safety_policy  # the prompt policy's version, in every heartbeat
        self.changed = threading.Event()
        self.worker_unknown = threading.Event()  # scheduler forgot us: the serve loop re-registers

    def set_status(self, status: WorkerStatus) -> None:
        with self._lock:
            if status != self._status:
                self._status = status
                self.changed.set()

    @property
    def status(self) -> WorkerStatus:
        with self._lock:
            return self._status

    # ------------------------------------------------------------ tasks and their stages

    def begin(self, task: Task, stage: str, limit_s: float) -> None:
        """Held from now on: the heartbeat renews its lease while `stage` is within `limit_s`."""
        with self._lock:
            self._held[task.id] = Held(task, stage, limit_s, self._clock() + limit_s)
            self._lost.discard(task.id)

    def stage(self, task: Task, stage: str, limit_s: float) -> None:
        """The task moved on: a new stage with its own deadline."""
        with self._lock:
            if (held := self._held.get(task.id)) is not None and held.task is task and not held.overdue:
                held.stage, held.limit_s, held.deadline = stage, limit_s, self._clock() + limit_s

    def end(self, task: Task) -> None:
        with self._lock:
            if (held := self._held.get(task.id)) is not None and held.task is task:
                del self._held[task.id]
                self._lost.discard(task.id)
                self._cancelled.discard(task.id)

    def overdue(self) -> list[Held]:
        """Tasks whose stage has just passed its deadline; each is returned once."""
        now = self._clock()
        with self._lock:
            late = [h for h in self._held.values() if not h.overdue and now > h.deadline]
            for held in late:
                held.overdue = True
        return late

    def held(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    def mark_lost(self, task_ids: list[str]) -> None:
        with self._lock:
            fresh = {t for t in task_ids if t in self._held} - self._lost
            self._lost.update(fresh)
            self._counters["leases_lost"] = self._counters.get("leases_lost", 0) + len(fresh)

    def mark_cancelled(self, task_ids: list[str]) -> list[str]:
        """Those it holds are dropped or discarded from now on; returns the ones it did not know."""
        with self._lock:
            fresh = sorted({t for t in task_ids if t in self._held} - self._cancelled)
            self._cancelled.update(fresh)
        return fresh

    def is_cancelled(self, task: Task) -> bool:
        with self._lock:
            held = self._held.get(task.id)
            return held is not None and held.task is task and task.id in self._cancelled

    def is_lost(self, task: Task) -> bool:
        """Drop what this attempt produces: it was abandoned past a deadline, the scheduler says its
        lease is gone or a client cancelled it, or a newer attempt of the task is held."""
        with self._lock:
            held = self._held.get(task.id)
            if task.abandoned or (held is not None and held.task is not task):
                return True
            return held is not None and (held.overdue or task.id in self._lost or task.id in self._cancelled)

    # ------------------------------------------------------------ serve loop progress

    def progress(self) -> None:
        with self._lock:
            self._progress = self._clock()

    def idle_s(self) -> float:
        with self._lock:
            return self._clock() - self._progress

    # ------------------------------------------------------------ readiness

    def storage_outcome(self, ok: bool) -> None:
        """The last store attempt's outcome: readiness is withdrawn while storage is unavailable."""
        with self._lock:
            self._storage_failing = not ok

    @property
    def storage_failing(self) -> bool:
        with self._lock:
            return self._storage_failing

    # ------------------------------------------------------------ counters

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def set_counter(self, name: str, value: int) -> None:
        with self._lock:
            self._counters[name] = value

    def raise_counter(self, name: str, value: int) -> None:
        """Keeps the largest value seen (a high-water mark)."""
        with self._lock:
            self._counters[name] = max(self._counters.get(name, 0), value)

    def snapshot(self) -> Heartbeat:
        """What the next heartbeat says. Only tasks within their stage's deadline are listed, so a
        task that stopped moving stops being renewed."""
        now = self._clock()
        with self._lock:
            moving = sorted(t for t, h in self._held.items() if not h.overdue and now <= h.deadline)
            return Heartbeat(status=self._status, in_flight=moving, timestamp=time.time(),
                             warnings=list(self.warnings), counters=dict(self._counters),
                             safety_policy=self.safety_policy)


class HeartbeatThread(threading.Thread):
    def __init__(self, client: QueueClient, worker_id: str, state: WorkerState, interval_s: float) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._client = client
        self.worker_id = worker_id
        self._state = state
        self._interval = interval_s
        self._halt = threading.Event()
        self.beats = 0

    def stop(self) -> None:
        self._halt.set()
        self._state.changed.set()

    def farewell(self) -> bool:
        """The last heartbeat, once a drain has finished the tasks: status `drained`, so the scheduler
        closes the registration instead of marking the worker `lost` when the beats stop. The thread
        is stopped first so that no `draining` beat follows (the scheduler would refuse it anyway).
        True when the scheduler will not show it `lost`."""
        self.stop()
        if self.is_alive():
            self.join(2 * self._interval)  # a beat under way ends within about its deadline, one interval
        self._state.set_status("drained")
        try:
            self._client.heartbeat(self.worker_id, self._state.snapshot(), deadline_s=self._interval)
        except NotFound:  # a retry after a lost answer, or a scheduler that forgot it: nothing to mark lost
            log.info("the scheduler already holds no live registration of worker %s", self.worker_id)
            return True
        except QueueError as e:  # leaving anyway: the scheduler's liveness time covers it, as for a crash
            log.warning("could not tell the scheduler that worker %s drained: %s", self.worker_id, e)
            return False
        log.info("told the scheduler that worker %s drained", self.worker_id)
        return True

    def run(self) -> None:
        next_beat = 0.0
        while not self._halt.is_set():
            # Wake at the interval or at once on a status change, whichever comes first.
            self._state.changed.wait(timeout=max(0.0, next_beat - time.monotonic()))
            self._state.changed.clear()
            if self._halt.is_set():
                break
            self.beat()
            next_beat = time.monotonic() + self._interval

    def beat(self) -> None:
        hb = self._state.snapshot()
        try:
            # Retries stay within one interval so beats never pile up behind each other.
            reply = self._client.heartbeat(self.worker_id, hb, deadline_s=self._interval)
        except NotFound:
            log.error("scheduler does not know worker %s; re-registering", self.worker_id)
            self._state.worker_unknown.set()
        except AuthError as e:
            self._state.count("heartbeat_failures")
            log.error("heartbeat refused: %s", e)
        except QueueError as e:
            self._state.count("heartbeat_failures")
            log.warning("heartbeat failed after retries: %s", e)
        else:
            self.beats += 1
            if reply.lost:
                log.warning("leases lost on %s", ", ".join(reply.lost))
                self._state.mark_lost(reply.lost)
            if reply.cancelled and (fresh := self._state.mark_cancelled(reply.cancelled)):
                log.info("cancelled by a client: %s", ", ".join(fresh))
