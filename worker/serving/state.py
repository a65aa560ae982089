"""What rank 0 says about itself, shared by the serve loop, the post pool, the heartbeat, the
watchdog and the operator endpoint: its status, when the serve loop last made progress, whether
storage is failing, the event that wakes the heartbeat, and whether the scheduler forgot the worker.
The tasks it holds and its counters are the ledger's (worker.serving.ledger)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from protocol import RegistrationStatus, WorkerModels, WorkerStatus


# The order a worker's status goes in (scheduler.store.lifecycle.REGISTRATION_TRANSITIONS).
FORWARD = (RegistrationStatus.INITIALIZING, RegistrationStatus.READY, RegistrationStatus.DRAINING,
           RegistrationStatus.DRAINED)


class WorkerState:
    def __init__(self, warnings: list[str] = (), clock: Callable[[], float] = time.monotonic,
                 safety_policy: str | None = None) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._status: WorkerStatus = RegistrationStatus.INITIALIZING
        self._progress = clock()
        self._storage_failing = False
        self.warnings = list(warnings)  # set once at start, e.g. a safety check switched off
        self.safety_policy = safety_policy  # the prompt policy's version, in every heartbeat
        self._models: WorkerModels | None = None  # what it holds and can load (worker.serving.swapping)
        self._adapters: list[str] | None = None  # the sets of adapters it holds loaded; None: never any
        self._grace_until = float("-inf")
        self.changed = threading.Event()  # the status changed: the heartbeat says so at once
        self._forgotten: set[str] = set()  # worker ids the scheduler said it does not know

    def set_status(self, status: WorkerStatus) -> None:
        """Moves the status forward only: a drain that began while the model loaded is not undone by
        the serve loop saying it is ready (the scheduler keeps a drain too)."""
        with self._lock:
            if FORWARD.index(status) > FORWARD.index(self._status):
                self._status = status
                self.changed.set()

    @property
    def status(self) -> WorkerStatus:
        with self._lock:
            return self._status

    def set_models(self, models: WorkerModels) -> None:
        with self._lock:
            if models != self._models:
                self._models = models
                self.changed.set()

    @property
    def models(self) -> WorkerModels | None:
        with self._lock:
            return self._models

    def set_adapters(self, keys: list[str]) -> None:
        with self._lock:
            self._adapters = list(keys)

    @property
    def adapters(self) -> list[str] | None:
        """The sets of adapters it holds loaded (worker.serving.adapter_sets), for the scheduler to
        route by; None while it has never held any (its calls then say nothing of them)."""
        with self._lock:
            return self._adapters

    # ------------------------------------------------------------ registration

    def forgotten(self, worker_id: str) -> None:
        """The scheduler answered a call made as `worker_id` with "unknown worker"."""
        with self._lock:
            self._forgotten.add(worker_id)

    def take_forgotten(self, worker_id: str) -> bool:
        """Whether the scheduler forgot `worker_id`, the current registration (the serve loop then
        registers again). A late answer to a call made under an earlier registration says nothing
        of this one: acted on, it made a second registration that nothing used, left to be lost."""
        with self._lock:
            forgotten, self._forgotten = worker_id in self._forgotten, set()
            return forgotten

    # ------------------------------------------------------------ serve loop progress

    def progress(self) -> None:
        with self._lock:
            self._progress = self._clock()

    def grant(self, seconds: float) -> None:
        """The serve loop is in a long step (a swap: loading a model) that may last `seconds`: it
        does not count as stalled before then."""
        with self._lock:
            self._grace_until = self._clock() + seconds

    def idle_s(self) -> float:
        with self._lock:
            return max(0.0, self._clock() - max(self._progress, self._grace_until))

    # ------------------------------------------------------------ readiness

    def storage_outcome(self, ok: bool) -> None:
        """The last store attempt's outcome: readiness is withdrawn while storage is unavailable."""
        with self._lock:
            self._storage_failing = not ok

    @property
    def storage_failing(self) -> bool:
        with self._lock:
            return self._storage_failing
