"""The LoRA adapters one engine's pipeline holds (diffusers' PEFT integration: load_lora_weights,
set_adapters), by content: a file is loaded once under a name made from its sha256 and stays while
rounds use it; beyond `keep` held, the least recently used that the round does not need are
deleted. A round names its set (sha256, file, scale); an empty set switches LoRA off, so the
adapter-free image is the one the engine makes without any adapter loaded.

Unfused (each layer adds its low-rank product): switching sets costs nothing but set_adapters.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class AdapterMismatch(ValueError):
    """The file's weights fit no layer of this model (another architecture, or other shapes)."""


@dataclass(frozen=True)
class Wanted:
    sha256: str
    path: Path
    scale: float
    field: str = "input.loras"  # the task's field that named it, for errors

    @property
    def name(self) -> str:
        return f"lora-{self.sha256[:16]}"


class Adapters:
    def __init__(self, pipe, keep: int = 8) -> None:
        self.pipe = pipe
        self.keep = keep
        self._held: OrderedDict[str, None] = OrderedDict()  # adapter names, least recently used first
        self.loads = 0

    def use(self, wanted: Sequence[Wanted]) -> None:
        """Makes the pipeline generate with exactly `wanted` at their scales (none: LoRA off)."""
        for adapter in wanted:
            if adapter.name not in self._held:
                self._load(adapter)
            self._held.move_to_end(adapter.name)
        self._evict(keep={a.name for a in wanted})
        if not wanted:
            if self._held:
                self.pipe.disable_lora()
            return
        self.pipe.enable_lora()
        self.pipe.set_adapters([a.name for a in wanted], adapter_weights=[a.scale for a in wanted])

    def held(self) -> list[str]:
        return list(self._held)

    def clear(self) -> None:
        """Deletes every adapter held: the pipeline is as loaded."""
        for name in list(self._held):
            self._forget(name)
        self._held.clear()

    def _load(self, adapter: Wanted) -> None:
        try:
            self.pipe.load_lora_weights(str(adapter.path), adapter_name=adapter.name)
        except (RuntimeError, ValueError, KeyError) as e:  # shapes of another model, keys it cannot map
            self._forget(adapter.name)
            raise AdapterMismatch(f"{adapter.field}: does not fit this model: {type(e).__name__}: "
                                  f"{str(e)[:300]}") from None
        if adapter.name not in {name for names in self.pipe.get_list_adapters().values() for name in names}:
            raise AdapterMismatch(f"{adapter.field}: does not fit this model: none of its weights name a layer of it")
        self._held[adapter.name] = None
        self.loads += 1
        log.info("adapter %s loaded", adapter.name)

    def _evict(self, keep: set[str]) -> None:
        for name in [n for n in self._held if n not in keep][:max(0, len(self._held) - self.keep)]:
            self._forget(name)
            del self._held[name]
            log.info("adapter %s deleted (least recently used)", name)

    def _forget(self, name: str) -> None:
        """Deletes `name` from every component that took it (nothing when none did)."""
        if any(name in names for names in self.pipe.get_list_adapters().values()):
            self.pipe.delete_adapters([name])
