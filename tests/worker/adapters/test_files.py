"""An adapter file is read from its header alone: safetensors of LoRA weights within lora.max_rank,
or refused naming the task's field."""

from __future__ import annotations

import pickle

import pytest
import torch
from safetensors.torch import save_file

from tests.worker.adapters.conftest import lora_file
from worker.adapters import AdapterRefused, inspect_file

FIELD = "input.loras[0].source"


def test_a_lora_in_either_layout_gives_its_rank(tmp_path):
    assert inspect_file(lora_file(tmp_path / "a.safetensors", rank=8), FIELD, 64).rank == 8
    kohya = inspect_file(lora_file(tmp_path / "k.safetensors", rank=4, layers=3, style="kohya"), FIELD, 64)
    assert (kohya.rank, kohya.tensors) == (4, 6)


@pytest.mark.parametrize("make, why", [
    (lambda p: torch.save({"lora_A.weight": torch.zeros(4, 4)}, p), "not a safetensors file (a pickle or another"),
    (lambda p: p.write_bytes(pickle.dumps({"x": 1})), "not a safetensors file"),
    (lambda p: p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"), "its header is not JSON"),
    (lambda p: p.write_bytes(b"abc"), "not a safetensors file (3 bytes)"),
    (lambda p: save_file({"transformer.proj.weight": torch.zeros(4, 4)}, str(p)), "holds no LoRA weights"),
])
def test_what_is_not_a_lora_in_safetensors_is_refused_naming_the_field(tmp_path, make, why):
    path = tmp_path / "bad.bin"
    make(path)
    with pytest.raises(AdapterRefused) as e:
        inspect_file(path, FIELD, 64)
    assert str(e.value).startswith(f"{FIELD}: ") and why in str(e.value)


def test_a_rank_above_the_limit_and_a_truncated_file_are_refused(tmp_path):
    with pytest.raises(AdapterRefused, match=r"rank 16 is above lora.max_rank \(8\)"):
        inspect_file(lora_file(tmp_path / "big.safetensors", rank=16), FIELD, 8)
    path = lora_file(tmp_path / "cut.safetensors")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(AdapterRefused, match="a damaged safetensors file"):
        inspect_file(path, FIELD, 64)
