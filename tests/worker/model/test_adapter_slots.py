"""LoRA adapters on a compiled transformer (speed.compile with an adapter source): Engine.load
prepares fixed slots before the compile, and a switch between adapter sets (none, one, three, a
larger rank on other layers, scales changed, back to none) never recompiles, counted by dynamo and
refused outright by `error_on_recompile`. The compile here is dynamo with the eager backend: the
guards that decide a recompile are dynamo's, whatever backend then builds the kernels, and Inductor
on CPU would cost CI a minute (`make bench-lora` times the real compile).

The slots' images are the ones the unfused, uncompiled adapters give, and none gives exactly the
adapter-free image."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from launch.tiny_model import make_tiny_lora
from worker.config import LoraConfig, ModelConfig, SpeedConfig
from worker.model.adapters import AdapterMismatch, Adapters, Slots, Wanted
from worker.model.engine import Engine
from worker.model.job import Job

JOB = Job(task_id="t", prompt="a red fox", width=64, height=64, steps=2, seed=5, output_format="png")
LORA = LoraConfig(allow=("https://hub.example/loras/",), max_adapters=3, max_rank=8)


def model(tiny_model) -> ModelConfig:
    return ModelConfig(name="tiny", source=str(tiny_model), dtype="float32", device="cpu", max_sequence_length=64)


@pytest.fixture(scope="module")
def compiled(tiny_model):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    engine = Engine.load(model(tiny_model), torch.device("cpu"), SpeedConfig(compile=True), lora=LORA)
    assert isinstance(engine.adapters, Slots)
    engine.pipe.transformer.compile(backend="eager", fullgraph=True, dynamic=False)  # see the module's note
    yield engine
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def files(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("loras")
    made = [make_tiny_lora(tiny_model, out / f"l{i}.safetensors", rank=4, seed=i) for i in range(3)]
    made.append(make_tiny_lora(tiny_model, out / "wide.safetensors", rank=8, seed=9,
                               targets=("to_q", "to_k", "to_v", "proj_out", "ff.net.2", "norm1.linear")))
    return [Wanted(hashlib.sha256(p.read_bytes()).hexdigest(), p, 1.0) for p in made]


def pick(files, *which: tuple[int, float]) -> list[Wanted]:
    return [Wanted(files[i].sha256, files[i].path, scale) for i, scale in which]


def image(engine) -> np.ndarray:
    return engine.generate(JOB).pixels.astype(int)


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


SETS = [(), ((0, 1.0),), ((0, 1.0), (1, 0.5)), ((2, 1.0), (0, 0.3), (1, -1.0)), ((3, 0.8),), ((0, 1.0), (0, 0.5))]


def test_switching_adapter_sets_never_recompiles_and_gives_the_unfused_images(compiled, files, tiny_model):
    plain = image(compiled)
    first = graphs()
    made = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        for chosen in SETS:
            compiled.adapters.use(pick(files, *chosen))
            made.append(image(compiled))
        loads = compiled.adapters.loads
        compiled.adapters.use(pick(files, (3, 0.8)))  # still in its slot (the least recently used went)
        again = image(compiled)
        compiled.adapters.use([])
        back = image(compiled)
    assert graphs() == first  # counted: one graph since the first image
    assert np.array_equal(made[0], plain) and np.array_equal(back, plain)  # none: exactly the adapter-free image
    assert compiled.adapters.loads == loads  # held in their slots, nothing reloaded
    reference = Engine.load(model(tiny_model), torch.device("cpu"))
    named = Adapters(reference.pipe)
    for chosen, got in zip(SETS, made):
        named.use(pick(files, *chosen))
        want = image(reference)
        assert np.abs(got - want).max() <= 1, chosen  # float rounding of another summation order at most
        assert chosen == () or np.abs(got - plain).max() > 0
    assert np.array_equal(again, made[4])


def test_more_adapters_than_slots_or_layers_no_slot_has_are_refused_and_leave_the_slots_at_zero(
        compiled, files, tmp_path):
    compiled.adapters.use([])
    plain = image(compiled)
    with pytest.raises(AdapterMismatch, match="holds 3 adapters at once"):
        compiled.adapters.use(pick(files, (0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0)))
    other = tmp_path / "other.safetensors"
    layer = "transformer.transformer_blocks.0.attn.to_q"
    save_file({f"{layer}.lora_A.weight": torch.ones(4, 999), f"{layer}.lora_B.weight": torch.ones(999, 4)},
              str(other))
    with pytest.raises(AdapterMismatch, match="does not fit this model's adapter slots"):
        compiled.adapters.use([Wanted("f" * 64, other, 1.0, "input.loras[0].source")])
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert np.array_equal(image(compiled), plain)
        compiled.adapters.use(pick(files, (0, 1.0)))
        assert np.abs(image(compiled) - plain).max() > 0
