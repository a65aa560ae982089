"""Rank 0's lease-ahead: a thread that leases, validates and text-checks the next tasks while the
current round generates, so the GPU never waits on the queue or the text check.

It keeps at most `target` admitted jobs ready (one round's worth). The serve loop takes rounds of
compatible jobs (same size and steps) in lease order: up to `capacity`, waiting at most `window_s`
from the moment the first of them was ready for more to arrive (batching).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.protocol import Lease
from worker.validation import Job

log = logging.getLogger(__name__)


@dataclass
class Admitted:
    lease: Lease
    job: Job
    timings: dict[str, float] = field(default_factory=dict)  # ms: lease, text_check, admit, wait
    ready_at: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job.width, self.job.height, self.job.steps)


class Intake:
    def __init__(self, lease: Callable[[int], list[Lease]],
                 admit: Callable[[Lease, dict[str, float]], Job | None], target: int) -> None:
        self._lease = lease  # n -> up to n leases (long-polls; handles its own errors and backoff)
        self._admit = admit  # validate + text check + report processing; None: failed and reported
        self._target = target
        self._ready: list[Admitted] = []
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

    def nudge(self) -> None:
        """Ends a waiting take() early (e.g. a result is ready to report)."""
        with self._cond:
            self._nudged = True
            self._cond.notify_all()

    def drained(self) -> bool:
        with self._cond:
            return not self._thread.is_alive() and not self._ready

    def close(self, join_s: float) -> list[Admitted]:
        """Stops, waits for the thread (bounded), and hands back everything still ready."""
        self.stop()
        self._thread.join(join_s)
        with self._cond:
            left, self._ready = self._ready, []
        return left

    def take(self, capacity: int, window_s: float, wait_s: float) -> list[Admitted]:
        """The next round, or [] if nothing was ready within `wait_s` or nudge() was called."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._ready:
                self._raise_if_failed()
                left = deadline - time.monotonic()
                if left <= 0 or self._nudged or not self._thread.is_alive():
                    self._nudged = False
                    return []
                self._cond.wait(left)
            key = self._ready[0].key
            until = self._ready[0].ready_at + window_s
            # Batching window: a partial round waits for more of its kind, unless draining.
            while (sum(a.key == key for a in self._ready) < capacity and not self._stop.is_set()
                   and (left := until - time.monotonic()) > 0):
                self._cond.wait(left)
            picked = [a for a in self._ready if a.key == key][:capacity]
            taken = {id(a) for a in picked}
            self._ready = [a for a in self._ready if id(a) not in taken]
            self._cond.notify_all()
        now = time.monotonic()
        for a in picked:
            a.timings["wait"] = (now - a.ready_at) * 1e3
        return picked

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    while len(self._ready) >= self._target and not self._stop.is_set():
                        self._cond.wait()
                    room = self._target - len(self._ready)
                if room > 0 and not self._stop.is_set():
                    self._fill(room)
        except BaseException as e:  # e.g. the scheduler refuses this worker: the serve loop raises it
            log.error("intake stopped: %s", e)
            self._error = e
        finally:
            with self._cond:
                self._cond.notify_all()

    def _fill(self, room: int) -> None:
        t0 = time.perf_counter()
        leases = self._lease(room)
        lease_ms = (time.perf_counter() - t0) * 1e3
        for lease in leases:
            timings = {"lease": lease_ms}
            job = self._admit(lease, timings)
            if job is not None:
                with self._cond:
                    self._ready.append(Admitted(lease, job, timings))
                    self._cond.notify_all()
