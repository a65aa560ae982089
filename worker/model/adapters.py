"""The LoRA adapters one engine's pipeline holds (diffusers' PEFT integration: load_lora_weights,
set_adapters), by content: a file is loaded once under a name made from its sha256 and stays while
rounds use it; beyond `keep` held, the least recently used that the round does not need are
deleted. A round names its set (sha256, file, scale); an empty set switches LoRA off, so the
adapter-free image is the one the engine makes without any adapter loaded.

Unfused (each layer adds its low-rank product): switching sets costs nothing but set_adapters.

A compiled transformer would recompile for every set (dynamo guards the adapters' names and
scales), so with `speed.compile` the pipeline holds `Slots` instead: `lora.max_adapters` fixed
adapters of rank `lora.max_rank` on every linear layer, zero and at scale 0, prepared before the
compile (peft's compiled hot-swap: the scales are tensors). A round copies its adapters' weights
into slots (diffusers' `load_lora_weights(hotswap=True)`, a smaller rank zero-padded) and writes
each slot's scale in place; an unused slot stays at scale 0, which adds exact zeros. Nothing the
compiled graph guards on changes, so a switch never recompiles.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def adapter_name(sha256: str) -> str:
    """An adapter's name in a pipeline (and in `held()`): made from its file's content."""
    return f"lora-{sha256[:16]}"


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
        return adapter_name(self.sha256)


def holder_for(pipe, lora, compiled: bool) -> "Adapters | Slots":
    """What holds a pipeline's adapters: with `compiled` and a source tasks may bring adapters from
    (`lora`, a LoraConfig), slots, prepared now, before the compile; otherwise adapters by name."""
    if lora is not None and lora.accepted and compiled:
        slots = Slots(pipe, lora.max_adapters, lora.max_rank)
        log.info("adapters: %s", slots.prepare())
        return slots
    return Adapters(pipe, keep=lora.keep if lora is not None else 8)


def combined(wanted: Sequence[Wanted]) -> list[Wanted]:
    """One entry per file: the same adapter named twice (two sources, one content) adds its
    low-rank product twice, which is the adapter once at the sum of the scales."""
    by_sha: dict[str, Wanted] = {}
    for adapter in wanted:
        seen = by_sha.get(adapter.sha256)
        by_sha[adapter.sha256] = adapter if seen is None else replace(seen, scale=seen.scale + adapter.scale)
    return list(by_sha.values())


class Adapters:
    def __init__(self, pipe, keep: int = 8) -> None:
        self.pipe = pipe
        self.keep = keep
        self._held: OrderedDict[str, None] = OrderedDict()  # adapter names, least recently used first
        self.loads = 0

    def use(self, wanted: Sequence[Wanted]) -> None:
        """Makes the pipeline generate with exactly `wanted` at their scales (none: LoRA off)."""
        wanted = combined(wanted)
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


SLOT = "dit-slot{}"


class Slots:
    """`count` adapters of rank `rank` that a compiled transformer never sees change shape."""

    def __init__(self, pipe, count: int, rank: int) -> None:
        self.pipe = pipe
        self.count = count
        self.rank = rank
        self._in: list[tuple[str, float] | None] = [None] * count  # each slot's (sha256, scale)
        self._scales: list[list] = []  # each slot's scale tensors, one per layer
        self._base: list[torch.Tensor | None] = [None] * count  # each slot's scales at 1.0, stacked
        self._used = [0] * count  # the round that last used each slot
        self._rounds = 0
        self.loads = 0

    def prepare(self) -> str:
        """Before the compile: the empty slots on every linear layer of the transformer."""
        from peft.tuners.lora import LoraLayer
        from peft.utils.hotswap import prepare_model_for_compiled_hotswap

        transformer = self.pipe.transformer
        empty = {}
        for name, module in transformer.named_modules():
            if isinstance(module, torch.nn.Linear):
                like = dict(dtype=module.weight.dtype, device=module.weight.device)
                empty[f"transformer.{name}.lora_A.weight"] = torch.zeros(self.rank, module.in_features, **like)
                empty[f"transformer.{name}.lora_B.weight"] = torch.zeros(module.out_features, self.rank, **like)
        names = [SLOT.format(i) for i in range(self.count)]
        for name in names:  # each its own tensors: a load may keep the ones it is given
            self.pipe.load_lora_weights({k: v.clone() for k, v in empty.items()}, adapter_name=name)
        self.pipe.set_adapters(names, adapter_weights=[1.0] * self.count)
        prepare_model_for_compiled_hotswap(transformer, config=transformer.peft_config)  # scales become tensors
        layers = [m for m in transformer.modules() if isinstance(m, LoraLayer)]
        self._scales = [[m.scaling[name] for m in layers if name in m.scaling] for name in names]
        for scales in self._scales:
            torch._foreach_mul_(scales, 0.0)
        return f"{self.count} LoRA slots of rank {self.rank} on {len(layers)} linear layers"

    def use(self, wanted: Sequence[Wanted]) -> None:
        """Makes the pipeline generate with exactly `wanted` at their scales (none: every slot at 0)."""
        wanted = combined(wanted)
        if len(wanted) > self.count:
            raise AdapterMismatch(f"{wanted[-1].field}: this worker holds {self.count} adapters at once")
        by_sha = {adapter.sha256: adapter for adapter in wanted}
        placed = {held[0]: i for i, held in enumerate(self._in) if held is not None and held[0] in by_sha}
        # Empty slots first, then the least recently used: what rounds use stays warm.
        free = sorted((i for i in range(self.count) if i not in placed.values()),
                      key=lambda i: (self._in[i] is not None, self._used[i]))
        for adapter in wanted:
            if adapter.sha256 not in placed:
                placed[adapter.sha256] = slot = free.pop(0)
                self._load(slot, adapter)
        for i in free:
            self._scale(i, 0.0)
        self._rounds += 1
        for sha, i in placed.items():
            self._scale(i, by_sha[sha].scale)
            self._used[i] = self._rounds

    def held(self) -> list[str]:
        return [adapter_name(held[0]) for held in self._in if held is not None]

    def clear(self) -> None:
        """Every slot empty and at scale 0 (its weights stay until a load overwrites them)."""
        for i in range(self.count):
            torch._foreach_mul_(self._scales[i], 0.0)
            self._in[i] = self._base[i] = None

    def _load(self, slot: int, adapter: Wanted) -> None:
        self._in[slot] = self._base[slot] = None  # half-copied until the load returns: at scale 0 meanwhile
        torch._foreach_mul_(self._scales[slot], 0.0)
        try:
            self.pipe.load_lora_weights(str(adapter.path), adapter_name=SLOT.format(slot), hotswap=True)
        except (RuntimeError, ValueError, KeyError) as e:  # layers no slot has, text-encoder weights, shapes
            torch._foreach_mul_(self._scales[slot], 0.0)
            raise AdapterMismatch(f"{adapter.field}: does not fit this model's adapter slots: {type(e).__name__}: "
                                  f"{str(e)[:300]}") from None
        # The load wrote each layer's own scale (alpha / rank); a task's scale multiplies it.
        self._base[slot] = torch.stack([t.detach().clone() for t in self._scales[slot]])
        self._in[slot] = (adapter.sha256, 1.0)
        self.loads += 1
        log.info("adapter %s loaded into slot %d", adapter.name, slot)

    def _scale(self, slot: int, scale: float) -> None:
        held, base = self._in[slot], self._base[slot]
        if held is None or base is None:
            return  # empty: at 0 since its last load or clear
        if held[1] != scale:
            torch._foreach_copy_(self._scales[slot], list((base * scale).unbind()))
            self._in[slot] = (held[0], scale)
