"""LoRA adapters on the tiny FLUX pipeline, built with peft at test time: an adapter changes the
image, its scale matters, switching sets and back to none gives exactly the images before, files
are loaded once and the least recently used go, and an adapter of another model is refused."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from launch.tiny_model import make_tiny_lora
from worker.config import ModelConfig
from worker.model.adapters import AdapterMismatch, Adapters, Wanted
from worker.model.engine import Engine
from worker.model.job import Job

JOB = Job(task_id="t", prompt="a red fox", width=64, height=64, steps=2, seed=5, output_format="png")


@pytest.fixture(scope="module")
def engine(tiny_model):
    torch.set_num_threads(1)
    return Engine.load(ModelConfig(name="tiny", source=str(tiny_model), dtype="float32", device="cpu",
                                   max_sequence_length=64), torch.device("cpu"))


@pytest.fixture(scope="module")
def files(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("loras")
    made = [make_tiny_lora(tiny_model, out / f"l{i}.safetensors", rank=4, seed=i) for i in range(3)]
    return [(hashlib.sha256(p.read_bytes()).hexdigest(), p) for p in made]


@pytest.fixture
def adapters(engine):
    held = Adapters(engine.pipe)
    yield held
    held.clear()
    assert engine.pipe.get_list_adapters() in ({}, {"transformer": []})


def wanted(files, *which: tuple[int, float]) -> list[Wanted]:
    return [Wanted(files[i][0], files[i][1], scale) for i, scale in which]


def image(engine) -> np.ndarray:
    return engine.generate(JOB).pixels.astype(int)


def test_an_adapter_changes_the_image_and_none_gives_it_back_exactly(engine, files, adapters):
    plain = image(engine)
    adapters.use(wanted(files, (0, 1.0)))
    one = image(engine)
    adapters.use(wanted(files, (0, 1.0), (1, 0.5)))
    two = image(engine)
    adapters.use(wanted(files, (0, 0.3)))
    weaker = image(engine)
    adapters.use([])
    assert np.abs(one - plain).max() > 0 and np.abs(two - one).max() > 0 and np.abs(weaker - one).max() > 0
    assert np.array_equal(image(engine), plain)  # adapters held, LoRA off: the adapter-free image
    adapters.use(wanted(files, (0, 1.0)))
    assert np.array_equal(image(engine), one)  # the same set again: the same image, nothing reloaded
    assert adapters.loads == 2


def test_beyond_keep_the_least_recently_used_are_deleted_never_one_in_use(engine, files, adapters):
    adapters.keep = 2
    for i in range(3):
        adapters.use(wanted(files, (i, 1.0)))
    names = [w.name for w in wanted(files, (1, 1.0), (2, 1.0))]
    assert adapters.held() == names
    assert {n for ns in engine.pipe.get_list_adapters().values() for n in ns} >= set(names)
    assert wanted(files, (0, 1.0))[0].name not in {n for ns in engine.pipe.get_list_adapters().values() for n in ns}
    adapters.use(wanted(files, (0, 1.0), (1, 1.0), (2, 1.0)))  # a set larger than keep is held whole
    assert len(adapters.held()) == 3


@pytest.mark.parametrize("layer, width", [
    ("transformer.transformer_blocks.0.attn.to_q", 999),  # a layer of this name, another shape
    ("transformer.no_such_block.0.proj", 32),  # no layer of this name
])
def test_an_adapter_for_another_model_is_refused_and_leaves_nothing(engine, tmp_path, adapters, layer, width):
    other = tmp_path / "other.safetensors"
    save_file({f"{layer}.lora_A.weight": torch.ones(4, width), f"{layer}.lora_B.weight": torch.ones(width, 4)},
              str(other))
    plain = image(engine)
    with pytest.raises(AdapterMismatch, match="does not fit this model"):
        adapters.use([Wanted("f" * 64, other, 1.0)])
    assert adapters.held() == [] and np.array_equal(image(engine), plain)
