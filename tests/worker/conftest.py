"""A one-rank gloo process group for the tests of what runs inside collectives."""

import pytest
import torch.distributed as dist

from worker.config import DistributedConfig
from worker.ranks.distributed import init_distributed


@pytest.fixture(scope="module")
def ctx(monkeypatch_module):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch_module.delenv(var, raising=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    ctx = init_distributed(DistributedConfig(backend="gloo"), "cpu")
    yield ctx
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()
