"""Which device a rank takes: "auto" falls back to the CPU only for float32 models."""

from __future__ import annotations

import pytest
import torch

from worker.config import ConfigError
from worker.ranks.distributed import pick_device


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_without_cuda_runs_float32_on_the_cpu(no_cuda):
    assert pick_device("auto", 0, "float32") == torch.device("cpu")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_auto_without_cuda_refuses_a_half_precision_model(no_cuda, dtype):
    with pytest.raises(ConfigError, match=f"model.device: 'auto' found no CUDA device, and a {dtype} model"):
        pick_device("auto", 0, dtype)


def test_a_named_cpu_is_honoured_whatever_the_dtype(no_cuda):
    assert pick_device("cpu", 0, "bfloat16") == torch.device("cpu")


def test_cuda_without_cuda_is_refused_naming_the_field(no_cuda):
    with pytest.raises(ConfigError, match="model.device: cuda requested but no CUDA device is visible"):
        pick_device("cuda", 0)
