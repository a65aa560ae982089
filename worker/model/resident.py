"""The models one rank holds resident, when a worker serves several ([model] and [models.<id>]).

Every rank holds the same ones: rank 0 decides each swap and broadcasts it (worker.ranks.lockstep
Swap), and every rank evicts, loads and warms up in the same order. Eviction frees the pipeline's
device memory before the next model is loaded: a GPU holds one 12B FLUX comfortably, rarely two.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from worker.model.engine import Engine
from worker.model.job import LoraRef

log = logging.getLogger(__name__)


class Resident:
    def __init__(self, load: Callable[[str], Engine], warm_up: Callable[[Engine], None],
                 adapter_files: Callable[[LoraRef], Path] | None = None) -> None:
        """`load(name)`: the model's engine, loaded; `warm_up(engine)`: every warm-up shape run;
        `adapter_files(ref)`: a LoRA adapter's file on this rank's node (None: adapters refused)."""
        self._load = load
        self._warm_up = warm_up
        self.adapter_files = adapter_files
        self.engines: dict[str, Engine] = {}

    def add(self, name: str, engine: Engine) -> None:
        """A model loaded and warmed up by the caller (the one at start)."""
        self.engines[name] = engine

    def names(self) -> list[str]:
        return list(self.engines)

    def engine(self, name: str) -> Engine:
        return self.engines[name]

    def load(self, name: str) -> Engine:
        """Loads and warms up `name`; on a failure nothing of it stays."""
        engine = self._load(name)
        try:
            self._warm_up(engine)
        except BaseException:
            del engine
            _free()
            raise
        self.engines[name] = engine
        return engine

    def evict(self, name: str) -> None:
        engine = self.engines.pop(name, None)
        if engine is not None:
            del engine
            _free()
            log.info("evicted %s", name)


def weights_mb(engine: Engine) -> int:
    """What its modules' parameters and buffers take: its size resident, for the memory budget."""
    total = 0
    for component in getattr(engine.pipe, "components", {}).values():
        if isinstance(component, torch.nn.Module):
            total += sum(t.numel() * t.element_size() for t in (*component.parameters(), *component.buffers()))
    return total >> 20


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
