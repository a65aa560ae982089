"""Who makes what in a round ([parallel] mode). A round is a tuple of batches, one per slot
(worker.serving.rounds decides which tasks go together):

data:    one slot per rank: rank r generates batch r (ranks past the last batch generate nothing);
         rank 0 gathers the images over the collective backend. A job's image depends only on its
         own (prompt, seed, size, steps), so the rank that made it does not matter.
context: one slot: every rank generates batch 0 together, each holding a slice of the sequence
         (worker.model.parallel); the coordinator keeps the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def slots(world: int, mode: str) -> int:
    """How many batches one round holds."""
    return world if mode == "data" else 1


def mine(batches: Sequence[Sequence[T]], rank: int, mode: str) -> list[T]:
    """The batch `rank` generates."""
    slot = rank if mode == "data" else 0
    return list(batches[slot]) if slot < len(batches) else []


def capacity(batch_size: int, world: int, mode: str) -> int:
    """How many jobs one round can hold."""
    return batch_size * slots(world, mode)
