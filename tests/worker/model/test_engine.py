"""The model stage on the tiny random-weight FLUX pipeline, loaded through from_pretrained."""

import numpy as np
import pytest
import torch

from worker.config import ModelConfig
from worker.model.engine import Engine, to_pictures
from worker.model.job import Job


@pytest.fixture(scope="module")
def engine(tiny_model):
    torch.set_num_threads(1)
    return Engine.load(ModelConfig(name="tiny", source=str(tiny_model), dtype="float32", device="cpu",
                                   max_sequence_length=64), torch.device("cpu"))


def job(**kw):
    base = dict(task_id="t", prompt="a red fox", width=128, height=64, steps=4, seed=1, output_format="png")
    return Job(**{**base, **kw})


def test_image_has_the_requested_size_and_dtype(engine):
    pic = engine.generate(job(width=192, height=64))
    assert pic.pixels.shape == (64, 192, 3) and pic.pixels.dtype == np.uint8 and pic.nonfinite == 0


def test_same_seed_same_pixels_other_seed_other_pixels(engine):
    a, b, c = (engine.generate(j).pixels for j in (job(), job(), job(seed=2)))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_prompt_changes_the_image(engine):
    assert not np.array_equal(engine.generate(job()).pixels, engine.generate(job(prompt="a blue whale")).pixels)


def test_nonfinite_values_are_counted_not_hidden_by_the_cast():
    out = torch.full((1, 3, 4, 4), 0.5)  # Bx3xHxW, as the VAE gives it
    out[0, 0, 0, 0], out[0, 1, 1, 1] = float("nan"), float("inf")
    pic, = to_pictures(out)
    assert pic.nonfinite == 2 and pic.pixels[0, 0, 0] == 0 and pic.pixels[2, 2, 2] == 128


def test_a_job_without_seed_is_refused(engine):
    with pytest.raises(ValueError, match="no seed"):
        engine.generate(job(seed=None))


def test_offline_mode_is_honoured_for_hub_ids(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(Exception) as e:
        Engine.load(ModelConfig(source="no-such-org/no-such-model", dtype="float32", device="cpu"),
                    torch.device("cpu"))
    assert "offline" in str(e.value).lower() or "cache" in str(e.value).lower()


def test_a_batch_is_the_pipelines_own_images_though_its_noise_is_drawn_beside_the_text_encoders(engine):
    """The engine draws each batch's noise on a thread while the text encoders are queued, then
    hands it to the pipeline: the same pixels as the pipeline drawing it from the jobs' generators."""
    jobs = [job(seed=5), job(seed=6, prompt="a blue whale")]
    ours = engine.generate_batch(jobs).pictures
    with torch.inference_mode():
        embeds, pooled = zip(*(engine.prompts.embed(j.prompt) for j in jobs))
        theirs = to_pictures(engine.pipe(
            prompt_embeds=torch.cat(embeds), pooled_prompt_embeds=torch.cat(pooled), width=128, height=64,
            num_inference_steps=4, guidance_scale=engine.cfg.guidance_scale, max_sequence_length=64,
            generator=[torch.Generator("cpu").manual_seed(j.seed) for j in jobs], output_type="pt").images)
    assert [np.array_equal(a.pixels, b.pixels) for a, b in zip(ours, theirs)] == [True, True]


def test_a_noise_draw_that_fails_fails_the_batch(engine, monkeypatch):
    monkeypatch.setattr(engine.pipe, "prepare_latents", lambda *a, **k: (_ for _ in ()).throw(MemoryError("host")))
    with pytest.raises(MemoryError, match="host"):
        engine.generate(job())
