"""The image checks with their real backends: NudeNet's shipped detector on generated images, and a
Hugging Face classifier loaded from a tiny random ViT saved locally."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from safety.config import HFClassifierConfig, ImageCheckConfig, NudeNetConfig
from safety.image import HFImageCheck, NudeNetCheck, build_image_check


@pytest.fixture(scope="module")
def generated(tiny_model) -> list[np.ndarray]:
    """Images from the tiny FLUX pipeline, as the worker hands them over (HxWx3 uint8 RGB)."""
    from worker.config import ModelConfig
    from worker.model.engine import Engine
    from worker.model.job import Job

    engine = Engine.load(ModelConfig(source=str(tiny_model), dtype="float32", device="cpu",
                                     max_sequence_length=64), torch.device("cpu"))
    sizes = [(256, 256), (384, 256), (256, 512)]
    return [engine.generate(Job(task_id=f"t{i}", prompt="a lighthouse", width=w, height=h, steps=4, seed=i,
                                output_format="png")).pixels for i, (w, h) in enumerate(sizes)]


def test_nudenet_runs_its_shipped_model_on_generated_images(generated):
    check = NudeNetCheck(NudeNetConfig())
    verdicts = check.check(generated)
    assert len(verdicts) == 3
    for v in verdicts:
        assert v.backend == "nudenet" and not v.refused
        assert set(v.scores) == set(NudeNetConfig().labels)


def test_nudenet_policy_flags_the_worst_configured_label(monkeypatch, generated):
    check = NudeNetCheck(NudeNetConfig(labels=("BUTTOCKS_EXPOSED", "ANUS_EXPOSED"), threshold=0.6))
    found = [{"class": "BUTTOCKS_EXPOSED", "score": 0.7, "box": [0, 0, 1, 1]},
             {"class": "FACE_FEMALE", "score": 0.99, "box": [0, 0, 1, 1]},  # not in the policy
             {"class": "ANUS_EXPOSED", "score": 0.65, "box": [0, 0, 1, 1]}]
    seen = []
    monkeypatch.setattr(check._detector, "detect", lambda img: seen.append(img) or found)
    v = check.check([generated[0]])[0]
    assert v.refused and v.category == "BUTTOCKS_EXPOSED" and v.score == pytest.approx(0.7)
    # NudeNet reads arrays in OpenCV's BGR order.
    assert np.array_equal(seen[0], generated[0][..., ::-1])


def hf(vit_dir, **kw) -> HFImageCheck:
    return HFImageCheck(HFClassifierConfig(model=str(vit_dir), **kw), "cpu")


def test_hf_classifier_loads_from_a_local_directory_and_scores_every_label(vit_dir, generated):
    verdicts = hf(vit_dir).check(generated)
    assert len(verdicts) == 3
    for v in verdicts:
        assert set(v.scores) == {"normal", "nsfw"} and sum(v.scores.values()) == pytest.approx(1.0)


def test_hf_classifier_configured_to_flag_everything(vit_dir, generated):
    verdicts = hf(vit_dir, threshold=0.0).check(generated)
    assert all(v.refused and v.category == "nsfw" for v in verdicts)
    assert not any(v.refused for v in hf(vit_dir, threshold=1.0).check(generated))


def test_hf_classifier_batches_give_the_same_scores(vit_dir, generated):
    images = [generated[0][:256, :256], generated[1][:256, :256], generated[2][:256, :256]] * 3
    batched = hf(vit_dir, batch_size=4).check(images)
    single = [hf(vit_dir, batch_size=1).check([img])[0] for img in images]
    assert len(batched) == 9
    for a, b in zip(batched, single):
        assert a.scores == pytest.approx(b.scores, abs=1e-5)


def test_off_builds_nothing():
    assert build_image_check(ImageCheckConfig(backend="off")) is None
