"""Rank 0's side of several models on one worker ([model] and [models.<id>]): which it holds
resident and which it can load (what the scheduler is told, at registration, in heartbeats and in
each lease), and the swap a round needs: decided here, then run on every rank in lockstep
(worker.ranks.lockstep.swap), evicting by a priority-weighted LRU under swap.memory_budget_mb.

Eviction: the resident model idle longest relative to its priority goes first (idle seconds /
priority: a model of priority 2 must sit idle twice as long as one of priority 1), until the model
to load fits. A model whose size is not known yet (never loaded, no memory_mb) is assumed to need the
whole budget. A budget of 0 holds one model at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from protocol import WorkerModels
from worker.config import ModelConfig
from worker.serving.state import WorkerState


class Models:
    def __init__(self, catalog: Mapping[str, ModelConfig], budget_mb: int, state: WorkerState,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._catalog = dict(catalog)
        self._budget_mb = budget_mb
        self._state = state
        self._clock = clock
        self._lock = threading.Lock()
        self._sizes = {name: m.memory_mb for name, m in catalog.items() if m.memory_mb}
        self._used: dict[str, float] = {}  # resident -> when it last made a round
        self._failed: dict[str, str] = {}  # -> why its load failed: no longer offered
        self.first = next(iter(catalog))  # the model loaded at start; a task naming none gets it
        self._tell()  # registered as holding none yet, able to load each

    def refusal(self, model: str) -> str | None:
        """Why this worker cannot make a task of `model`, or None."""
        with self._lock:
            if model not in self._catalog:
                return f"this worker does not serve model {model!r} (it serves: {', '.join(self._catalog)})"
            if why := self._failed.get(model):
                return f"model {model!r} failed to load on this worker: {why}"
        return None

    def wire(self) -> WorkerModels:
        with self._lock:
            return self._wire()

    def victims(self, model: str) -> tuple[str, ...]:
        """The resident models to evict before `model` is loaded."""
        with self._lock:
            if not self._budget_mb:
                return tuple(self._used)
            need = self._sizes.get(model, self._budget_mb)
            now = self._clock()
            order = sorted(self._used, key=lambda m: (now - self._used[m]) / self._catalog[m].priority, reverse=True)
            kept, out = list(order), []
            while kept and sum(self._sizes.get(m, self._budget_mb) for m in kept) + need > self._budget_mb:
                out.append(kept.pop(0))
            return tuple(out)

    def loading(self, model: str, evicted: tuple[str, ...]) -> None:
        """A swap has begun: it is said to hold `model` (and no longer `evicted`) from now on, as the
        scheduler marked it when it leased the task. Leases made meanwhile (the lease-ahead) must not
        say otherwise, or the scheduler would send `model`'s tasks to other workers to load too."""
        with self._lock:
            for name in evicted:
                self._used.pop(name, None)
            self._used[model] = self._clock()
        self._tell()

    def loaded(self, model: str, evicted: tuple[str, ...], size_mb: int) -> None:
        """A swap (or the start) made `model` resident on every rank, after evicting `evicted`."""
        with self._lock:
            for name in evicted:
                self._used.pop(name, None)
            self._used[model] = self._clock()
            if size_mb:  # measured; memory_mb, where set, stays what counts
                self._sizes.setdefault(model, size_mb)
        self._tell()

    def failed(self, model: str, evicted: tuple[str, ...], why: str) -> None:
        """Its load failed on some rank: no rank keeps it, and it is no longer offered."""
        with self._lock:
            for name in (*evicted, model):
                self._used.pop(name, None)
            self._failed[model] = why
        self._tell()

    def used(self, model: str) -> None:
        with self._lock:
            self._used[model] = self._clock()

    def _wire(self) -> WorkerModels:
        return WorkerModels(resident=list(self._used),
                            loadable=[m for m in self._catalog if m not in self._used and m not in self._failed])

    def _tell(self) -> None:
        self._state.set_models(self.wire())  # the next heartbeat says it at once
