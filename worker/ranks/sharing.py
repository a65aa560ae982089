"""Who makes what in a round of jobs ([parallel] mode).

data:    rank r generates jobs r, r + world, r + 2 world, ...; rank 0 gathers the images over the
         collective backend. A job's image depends only on its own (prompt, seed, size, steps), so
         it is the same bytes whichever rank made it.
context: every rank generates every job of the round together, each holding a slice of the
         sequence (worker.model.parallel); the coordinator keeps the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def slots(n: int, rank: int, world: int, mode: str) -> range:
    """The positions in a round of n jobs that `rank` generates."""
    if mode == "context" or world == 1:
        return range(n)
    return range(rank, n, world)


def share(items: Sequence[T], rank: int, world: int, mode: str) -> list[T]:
    """This rank's part of a round."""
    return [items[i] for i in slots(len(items), rank, world, mode)]


def capacity(batch_size: int, world: int, mode: str) -> int:
    """How many jobs one round can hold."""
    return batch_size * (world if mode == "data" else 1)
