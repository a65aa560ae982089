"""How much rank 0 holds at each stage, from the config and the size of the group: the round, the
lease-ahead cap, the post pool and the bound on unreported tasks. Decided once at start; a config
that cannot work on this group is refused here, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.config import ConfigError, WorkerConfig
from worker.ranks import sharing


@dataclass(frozen=True)
class Sizes:
    slots: int  # batches per round: ranks in data mode, 1 in context mode
    per_slot: int  # images per batch (batch.max_size)
    lease_ahead: int  # admitted tasks held waiting for a round
    post_workers: int  # threads of the post stage
    max_pending: int  # generated, not yet reported

    @property
    def round(self) -> int:
        return self.slots * self.per_slot


def size(cfg: WorkerConfig, world_size: int) -> Sizes:
    slots = sharing.slots(world_size, cfg.parallel.mode)
    one_round = sharing.capacity(cfg.batch.max_size, world_size, cfg.parallel.mode)
    why = f"one round is {one_round} image(s): batch.max_size {cfg.batch.max_size} x {slots} slot(s)"
    lease_ahead = cfg.queue.lease_ahead or 2 * one_round
    if lease_ahead < one_round:
        raise ConfigError(f"queue.lease_ahead: {lease_ahead} cannot fill a round ({why}); "
                          f"set at least {one_round}, or 0 for auto ({2 * one_round})")
    max_pending = cfg.storage.max_pending or 2 * one_round
    if max_pending < one_round:
        raise ConfigError(f"storage.max_pending: {max_pending} is less than a round ({why}), so every round "
                          f"would wait for all post-processing; set at least {one_round}, or 0 for auto "
                          f"({2 * one_round})")
    return Sizes(slots, cfg.batch.max_size, lease_ahead, cfg.storage.workers or max(2, one_round), max_pending)
