"""Image checks that cannot load stop start-up with a message naming the field to fix."""

from __future__ import annotations

import pytest

from safety.config import HFClassifierConfig, NudeNetConfig
from safety.image import HFImageCheck, NudeNetCheck
from safety.verdicts import SafetyLoadError


def test_nudenet_label_that_does_not_exist():
    # A misspelt label would never flag anything: refused at load.
    with pytest.raises(SafetyLoadError, match=r"safety.image.nudenet.labels: BUTOCKS_EXPOSED"):
        NudeNetCheck(NudeNetConfig(labels=("BUTOCKS_EXPOSED",)))


def test_nudenet_model_file_missing(tmp_path):
    with pytest.raises(SafetyLoadError, match="safety.image.nudenet"):
        NudeNetCheck(NudeNetConfig(model_path=str(tmp_path / "missing.onnx")))


def test_hf_flag_label_the_model_does_not_have(vit_dir):
    with pytest.raises(SafetyLoadError, match=r"flag_labels: porn not among the model's labels \(normal, nsfw\)"):
        HFImageCheck(HFClassifierConfig(model=str(vit_dir), flag_labels=("porn",)), "cpu")


def test_hf_model_that_cannot_be_loaded(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SafetyLoadError, match="safety.image.hf.model: cannot load 'no-such-org/nsfw'"):
        HFImageCheck(HFClassifierConfig(model="no-such-org/nsfw"), "cpu")
