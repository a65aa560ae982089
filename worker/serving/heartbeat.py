"""Rank 0's heartbeat: a daemon thread that never waits on the GPU.

It reports the worker's status, in-flight task ids, warnings and counters every interval, which renews their leases on
the scheduler; the reply names leases this worker has lost, so their results are not reported.
A status change (e.g. to "ready") is sent at once rather than at the next tick.
"""

from __future__ import annotations

import logging
import threading
import time

from protocol import Heartbeat, WorkerStatus
from worker.serving.queue_client import AuthError, NotFound, QueueClient, QueueError

log = logging.getLogger(__name__)


class WorkerState:
    """What rank 0 is doing, shared between the serve loop and the heartbeat thread."""

    def __init__(self, warnings: list[str] = ()) -> None:
        self._lock = threading.Lock()
        self._status: WorkerStatus = "initializing"
        self._in_flight: set[str] = set()
        self._lost: set[str] = set()
        self._counters: dict[str, int] = {}
        self.warnings = list(warnings)  # set once at start, e.g. a safety check switched off
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

    def begin(self, task_id: str) -> None:
        with self._lock:
            self._in_flight.add(task_id)

    def end(self, task_id: str) -> None:
        with self._lock:
            self._in_flight.discard(task_id)
            self._lost.discard(task_id)

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
        with self._lock:
            return Heartbeat(status=self._status, in_flight=sorted(self._in_flight), timestamp=time.time(),
                             warnings=list(self.warnings), counters=dict(self._counters))

    def mark_lost(self, task_ids: list[str]) -> None:
        with self._lock:
            self._lost.update(t for t in task_ids if t in self._in_flight)

    def is_lost(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._lost


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
            log.error("heartbeat refused: %s", e)
        except QueueError as e:
            log.warning("heartbeat failed after retries: %s", e)
        else:
            self.beats += 1
            if reply.lost:
                log.warning("leases lost on %s", ", ".join(reply.lost))
                self._state.mark_lost(reply.lost)
