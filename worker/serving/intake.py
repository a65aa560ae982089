"""Rank 0's lease-ahead: a thread that leases and admits (validates, text-checks) the next tasks
while the current round generates, so the GPU never waits on the queue or the text check.

It keeps at most `target` admitted tasks ready: the lease-ahead cap, enough to fill a round and to
choose among (a worker must not hoard tasks other workers could run). The serve loop takes rounds
planned by worker.serving.rounds, waiting at most `window_s` from the moment the oldest ready task
was admitted for more to arrive, unless the round is already full (batching).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from protocol import Lease
from worker.serving import rounds
from worker.serving.task import Task

log = logging.getLogger(__name__)


class Leases(Protocol):
    def lease(self, n: int, hungry: bool = True, wake: Callable[[], bool] = lambda: False) -> list[Lease]:
        """Up to n leases; long-polls, and handles its own errors and backoff. Not `hungry`: it may
        wait (until `wake()`) for a report's call to carry the request."""

    def wake(self) -> None:
        """A waiting request's `wake` may have changed (fewer ready, or stopping)."""


class Gate(Protocol):
    def admit(self, tasks: list[Task]) -> list[Task]:
        """Those that may be generated now; the others were failed and reported, or dropped, or
        come later through `Intake.add` (their adapters are being fetched)."""

    def pending(self) -> int:
        """Tasks admitted that come later: counted against the lease-ahead cap."""


class Intake:
    def __init__(self, leases: Leases, gate: Gate, target: int, round_: int = 1) -> None:
        """`target`: the lease-ahead cap; with `round_` ready, a request for more may wait for a report."""
        self._leases = leases
        self._gate = gate
        self._target = target
        self._round = round_
        self._ready: list[Task] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._nudged = False
        self._thread = threading.Thread(target=self._run, name="intake", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No new leases; what is already leased is still admitted and served."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._leases.wake()

    def nudge(self) -> None:
        """Ends a waiting take() early (e.g. a result is ready to report)."""
        with self._cond:
            self._nudged = True
            self._cond.notify_all()

    def drained(self) -> bool:
        with self._cond:
            return not self._thread.is_alive() and not self._ready and not self._gate.pending()

    def close(self, join_s: float) -> list[Task]:
        """Stops, waits for the thread (bounded), and hands back every task still ready."""
        self.stop()
        self._thread.join(join_s)
        with self._cond:
            left, self._ready = self._ready, []
        return left

    def withdraw(self, which: Callable[[Task], bool]) -> list[Task]:
        """Takes the waiting tasks `which` picks out of the queue for a round (e.g. cancelled ones)."""
        with self._cond:
            out = [t for t in self._ready if which(t)]
            if out:
                self._ready = [t for t in self._ready if not which(t)]
                self._cond.notify_all()
        return out

    def take(self, slots: int, per_slot: int, window_s: float, wait_s: float) -> list[list[Task]]:
        """The next round (one batch per slot); [] if nothing was ready within `wait_s`, or on nudge()."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._ready:
                if self._error is not None:  # e.g. the scheduler refused this worker
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0 or self._nudged or not self._thread.is_alive():
                    self._nudged = False
                    return []
                self._cond.wait(left)
            until = self._ready[0].ready_at + window_s
            # Batching window: a round that is not full waits for more tasks, unless draining.
            while (not rounds.full(batches := rounds.plan(self._one_model(), slots, per_slot), slots, per_slot)
                   and not self._stop.is_set() and (left := until - time.monotonic()) > 0):
                self._cond.wait(left)
            taken = {id(t) for batch in batches for t in batch}
            self._ready = [t for t in self._ready if id(t) not in taken]
            self._cond.notify_all()
        if self._hungry():
            self._leases.wake()
        now = time.monotonic()
        for batch in batches:
            for task in batch:
                task.timings.record(wait=(now - task.ready_at) * 1e3)
        return batches

    def _one_model(self) -> list[Task]:
        """The ready tasks of the oldest one's model and adapters: a round runs one of each."""
        model, adapters = self._ready[0].model, self._ready[0].adapter_set
        return [t for t in self._ready if t.model == model and t.adapter_set == adapters]

    def _hungry(self) -> bool:  # less than a round ready: the next round would wait for the queue
        return len(self._ready) < self._round

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    while len(self._ready) + self._gate.pending() >= self._target and not self._stop.is_set():
                        self._cond.wait()
                    room = self._target - len(self._ready) - self._gate.pending()
                if room > 0 and not self._stop.is_set():
                    self._fill(room)
        except BaseException as e:  # e.g. the scheduler refuses this worker: the serve loop raises it
            log.error("intake stopped: %s", e)
            self._error = e
        finally:
            with self._cond:
                self._cond.notify_all()

    def add(self, admitted: list[Task]) -> None:
        """Tasks the gate admitted after its call returned (their adapters fetched meanwhile)."""
        with self._cond:
            for task in admitted:
                task.ready_at = time.monotonic()
                self._ready.append(task)
            self._cond.notify_all()

    def _fill(self, room: int) -> None:
        t0 = time.perf_counter()
        leases = self._leases.lease(room, hungry=self._hungry(), wake=self._hungry)
        lease_ms = (time.perf_counter() - t0) * 1e3
        tasks = [Task(lease) for lease in leases]
        for task in tasks:
            task.timings.record(lease=lease_ms)
        self.add(self._gate.admit(tasks) if tasks else [])
