"""Which ready tasks the next round takes, and which rank makes each: the round policy
(docs/benchmarks.md#keeping-the-gpu-busy).

A round is one batch per slot. A slot is one rank in data mode (each rank generates its own batch,
so ranks may make different sizes in one round) and the whole group in context mode (one slot,
every rank working on the same images). A batch holds tasks of one shape (size and steps), at most
`per_slot` images of them (a task asks for one or several); a task of more images than that is a
batch of its own, made in several passes. The ranks meet at a barrier after every round, so a round
lasts as long as its most expensive batch; a batch costs pixels x steps x images.

1. The oldest ready task is always in the round, so no task waits behind younger ones for more
   rounds than there are tasks ahead of it (the lease-ahead cap bounds that).
2. Its batch takes the next tasks of its shape, in lease order.
3. Each other slot takes the batch that best fills the round without making it longer: the most
   expensive waiting batch that costs no more than the round's most expensive so far, the oldest
   among equals. When none fits, the oldest waiting batch: a longer round still makes more images
   than an idle rank.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, TypeVar


class Shaped(Protocol):
    @property
    def shape(self) -> tuple[int, int, int]:
        """(width, height, steps): tasks of one shape can share a batch."""

    @property
    def images(self) -> int:
        """How many images it asks for."""


T = TypeVar("T", bound=Shaped)


def images(batch: Sequence[Shaped]) -> int:
    return sum(task.images for task in batch)


def cost(batch: Sequence[Shaped]) -> int:
    width, height, steps = batch[0].shape
    return width * height * steps * images(batch)


def plan(ready: Sequence[T], slots: int, per_slot: int) -> list[list[T]]:
    """At most `slots` batches of one shape each, drawn from `ready` (in lease order)."""
    batches = _batches(ready, per_slot)
    if not batches:
        return []
    chosen = [batches.pop(0)]
    longest = cost(chosen[0])
    while batches and len(chosen) < slots:
        fits = [b for b in batches if cost(b) <= longest]
        pick = max(fits, key=cost) if fits else batches[0]  # max() keeps the first (oldest) of equals
        batches.remove(pick)
        chosen.append(pick)
        longest = max(longest, cost(pick))
    return chosen


def full(batches: Sequence[Sequence[Shaped]], slots: int, per_slot: int) -> bool:
    """Every slot has a whole batch: waiting for more tasks cannot make this round bigger."""
    return len(batches) == slots and all(images(b) >= per_slot for b in batches)


def _batches(ready: Sequence[T], per_slot: int) -> list[list[T]]:
    """Each shape's tasks, in lease order, cut into batches of at most `per_slot` images (a task of
    more is a batch alone), ordered by their oldest task."""
    groups: dict[Hashable, list[list[T]]] = {}
    for task in ready:
        cut = groups.setdefault(task.shape, [[]])
        if cut[-1] and images(cut[-1]) + task.images > per_slot:
            cut.append([])
        cut[-1].append(task)
    order = {id(t): i for i, t in enumerate(ready)}
    batches = [batch for cut in groups.values() for batch in cut]
    return sorted(batches, key=lambda b: order[id(b[0])])
