"""Rank 0's sizes follow the group; a config that cannot work on it is refused, naming the field."""

from __future__ import annotations

import pytest

from worker.config import ConfigError, WorkerConfig
from worker.serving.sizing import size


def cfg(**sections) -> WorkerConfig:
    return WorkerConfig.model_validate({"model": {"device": "cpu"}, **sections})


def test_auto_sizes_follow_ranks_and_batch():
    s = size(cfg(batch={"max_size": 2}), world_size=8)
    assert (s.slots, s.per_slot, s.round) == (8, 2, 16)
    assert (s.lease_ahead, s.max_pending, s.post_workers) == (32, 32, 16)
    one = size(cfg(), world_size=1)
    assert (one.round, one.lease_ahead, one.max_pending, one.post_workers) == (1, 2, 2, 2)


def test_context_mode_is_one_slot():
    s = size(cfg(parallel={"mode": "context"}, batch={"max_size": 2}), world_size=4)
    assert (s.slots, s.round, s.max_pending) == (1, 2, 4)


def test_explicit_values_are_kept():
    s = size(cfg(storage={"workers": 3, "max_pending": 9}, queue={"lease_ahead": 12}), world_size=4)
    assert (s.post_workers, s.max_pending, s.lease_ahead) == (3, 9, 12)


def test_max_pending_below_a_round_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"storage.max_pending: 4 is less than a round .*8 image.*at least 8"):
        size(cfg(storage={"max_pending": 4}), world_size=8)


def test_lease_ahead_below_a_round_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"queue.lease_ahead: 3 cannot fill a round"):
        size(cfg(queue={"lease_ahead": 3}), world_size=4)
