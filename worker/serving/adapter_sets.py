"""The sets of LoRA adapters this worker holds loaded, as the scheduler routes by them (each a task's
`input.loras` named by protocol.adapter_set_key): each set a round used, for as long as every
adapter of it is still loaded in the pipeline. Leases and exchanges say them, so the scheduler
gives this worker those sets' tasks first and leaves them to it for a while."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from protocol import MAX_ADAPTER_SETS, adapter_set_key
from worker.model.adapters import adapter_name


class HeldSets:
    def __init__(self, most: int = MAX_ADAPTER_SETS) -> None:
        self._sets: OrderedDict[str, frozenset[str]] = OrderedDict()  # key -> its adapters' names, by use
        self._most = most

    def used(self, key: str, names: Iterable[str]) -> None:
        """A round ran the set `key` with these adapters (their names in the pipeline)."""
        if not key:
            return
        self._sets[key] = frozenset(names)
        self._sets.move_to_end(key)
        while len(self._sets) > self._most:
            self._sets.popitem(last=False)

    def held(self, loaded: Iterable[str]) -> list[str]:
        """The sets whose adapters are all among `loaded` (the pipeline's now), most recent first;
        the others are forgotten."""
        loaded = set(loaded)
        for key in [k for k, names in self._sets.items() if not names <= loaded]:
            del self._sets[key]
        return list(reversed(self._sets))

    def after(self, round_: list, engine, state) -> None:
        """A round ran on `engine`: its set counted as held, and `state` (what the worker's calls
        say) told the sets it holds now. Nothing while it has never held adapters."""
        holder = getattr(engine, "adapters", None)
        job = round_[0].job
        if holder is None or job is None or (not job.loras and state.adapters is None):
            return
        self.used(adapter_set_key(round_[0].lease.input.get("loras")),
                  [adapter_name(ref.sha256) for ref in job.loras if ref.sha256])
        state.set_adapters(self.held(holder.held()))
