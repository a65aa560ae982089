"""The output quality check: solid colours and NaN-derived images are caught, real outputs pass."""

from __future__ import annotations

import numpy as np
import torch
import pytest

from safety.quality import inspect
from worker.model.engine import to_pictures


@pytest.mark.parametrize("colour", [(0, 0, 0), (128, 128, 128), (255, 0, 0), (12, 200, 99)])
def test_solid_colours_are_caught(colour):
    q = inspect(np.full((64, 96, 3), colour, np.uint8), 0, min_std=2.0)
    assert not q.ok and "nearly solid" in q.reason and q.std == 0.0


def test_faint_noise_on_a_solid_colour_is_still_solid():
    rng = np.random.default_rng(0)
    img = np.clip(128 + rng.normal(0, 0.5, (64, 64, 3)), 0, 255).astype(np.uint8)
    assert not inspect(img, 0, min_std=2.0).ok


def test_a_gradient_passes():
    ramp = np.linspace(0, 255, 64, dtype=np.float32)
    img = np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], ramp[None, ::-1]), -1).astype(np.uint8)
    q = inspect(img, 0, min_std=2.0)
    assert q.ok and q.reason is None and q.std > 50


def test_nan_output_is_caught_even_where_the_cast_hides_it():
    out = np.random.default_rng(0).random((64, 64, 3), dtype=np.float32)
    out[:8] = np.nan  # a band of NaN: the rest of the image still varies
    pic = to_pictures(torch.from_numpy(out).permute(2, 0, 1)[None])[0]  # HxWx3 -> 1x3xHxW, as the VAE gives
    q = inspect(pic.pixels, pic.nonfinite, min_std=2.0)
    assert not q.ok and "non-finite" in q.reason and pic.nonfinite == 8 * 64 * 3


def test_generated_images_pass(tiny_model):
    import torch

    from worker.config import ModelConfig
    from worker.model.engine import Engine
    from worker.model.job import Job

    engine = Engine.load(ModelConfig(source=str(tiny_model), dtype="float32", device="cpu",
                                     max_sequence_length=64), torch.device("cpu"))
    pic = engine.generate(Job(task_id="t", prompt="a fox", width=128, height=128, steps=4, seed=3,
                              output_format="png"))
    assert inspect(pic.pixels, pic.nonfinite, min_std=2.0).ok
