"""What rank 0 says about itself, shared by the serve loop, the post pool, the heartbeat, the
watchdog and the operator endpoint: its status, when the serve loop last made progress, whether
storage is failing, and the events that wake the heartbeat or make the serve loop register again.
The tasks it holds and its counters are the ledger's (worker.serving.ledger)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from protocol import WorkerStatus


class WorkerState:
    def __init__(self, warnings: list[str] = (), clock: Callable[[], float] = time.monotonic,
                 safety_policy: str | None = None) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._status: WorkerStatus = "initializing"
        self._progress = clock()
        self._storage_failing = False
        self.warnings = list(warnings)  # set once at start, e.g. a safety check switched off
        self.safety_policy = safety_policy  # the prompt policy's version, in every heartbeat
        self.changed = threading.Event()  # the status changed: the heartbeat says so at once
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
