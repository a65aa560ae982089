"""A second diffusers family, PixArt-Sigma: a tiny random-weight pipeline saved by make-tiny-model
loads through DiffusionPipeline.from_pretrained with the speed switches configs/tiny.toml uses, and
serves as FLUX does. FLUX still loads through the same generic path."""

import logging

import numpy as np
import pytest
import torch

from launch.tiny_model import make_tiny_model
from worker.config import ModelConfig, SpeedConfig
from worker.model.engine import Engine
from worker.model.job import Job

# [speed] of configs/tiny.toml (compile off).
TINY_SPEED = SpeedConfig(fuse_qkv=True, channels_last_vae=True, prompt_cache_size=256)


def pixart(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(name="tiny-pixart", dtype="float32", device="cpu", random_arch="none",
                                 max_sequence_length=64), **kw})


@pytest.fixture(scope="module")
def pixart_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-pixart", arch="tiny-pixart")


@pytest.fixture(scope="module")
def engine(pixart_dir):
    torch.set_num_threads(1)
    return Engine.load(pixart(source=str(pixart_dir)), torch.device("cpu"), TINY_SPEED)


def job(**kw):
    base = dict(task_id="t", prompt="a red fox", width=64, height=64, steps=2, seed=1, output_format="png")
    return Job(**{**base, **kw})


def off_by_at_most_one(a: np.ndarray, b: np.ndarray) -> bool:
    return int(np.abs(a.astype(int) - b.astype(int)).max()) <= 1


def test_a_saved_pixart_pipeline_loads_from_pretrained_and_gives_the_requested_size(engine):
    from diffusers import PixArtSigmaPipeline

    assert isinstance(engine.pipe, PixArtSigmaPipeline) and not engine.flux
    pic = engine.generate(job(width=96, height=64))
    assert pic.pixels.shape == (64, 96, 3) and pic.pixels.dtype == np.uint8 and pic.nonfinite == 0


def test_same_job_same_pixels_other_seed_or_prompt_other_pixels(engine):
    a, b, c, d = (engine.generate(j).pixels for j in (job(), job(), job(seed=2), job(prompt="a blue whale")))
    assert np.array_equal(a, b) and not np.array_equal(a, c) and not np.array_equal(a, d)


def test_in_a_batch_each_job_gets_its_own_image_and_the_stages_are_timed(engine):
    jobs = [job(), job(prompt="a blue whale", seed=2)]
    steps = []
    batch = engine.generate_batch(jobs, on_step=steps.append)
    # Same noise and conditioning as alone; the kernels of a batch of two round differently (the
    # floats differ by about 1e-6), which can move a pixel across an 8-bit boundary: within 1/255.
    for got, j in zip(batch.pictures, jobs):
        assert off_by_at_most_one(got.pixels, engine.generate(j).pixels)
    assert not np.array_equal(batch.pictures[0].pixels, batch.pictures[1].pixels)
    assert steps == [0, 1] and set(batch.timings) == {"embed", "denoise", "vae"}
    assert all(t > 0 for t in batch.timings.values())


def test_random_arch_tiny_pixart_builds_what_make_tiny_model_saves(engine):
    built = Engine.load(pixart(source="unused", random_arch="tiny-pixart"), torch.device("cpu"))
    # The saved engine runs with fused QKV projections: the same image within 1/255.
    assert off_by_at_most_one(built.generate(job()).pixels, engine.generate(job()).pixels)


def test_switches_pixart_cannot_use_are_skipped_with_a_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="worker.model"):
        built = Engine.load(pixart(source="unused", random_arch="tiny-pixart"), torch.device("cpu"),
                            SpeedConfig(attention_backend="native", prompt_cache_size=4))
    assert "speed.attention_backend skipped" in caplog.text and "speed.prompt_cache_size skipped" in caplog.text
    assert built.generate(job()).pixels.shape == (64, 64, 3)


def test_flux_still_loads_through_the_generic_path_as_a_flux_pipeline(tiny_model):
    from diffusers import FluxPipeline

    flux = Engine.load(ModelConfig(name="tiny", source=str(tiny_model), dtype="float32", device="cpu",
                                   max_sequence_length=64), torch.device("cpu"), TINY_SPEED)
    assert isinstance(flux.pipe, FluxPipeline) and flux.flux
    assert flux.generate(job()).pixels.shape == (64, 64, 3) and flux.prompts.hits == 0
