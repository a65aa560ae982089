"""Prompt checks that cannot load stop start-up with a message naming the field to fix."""

from __future__ import annotations

import pytest
import torch

from safety.config import DetoxifyConfig, TextCheckConfig
from safety.text import DetoxifyCheck, build_text_check
from safety.verdicts import SafetyLoadError


def test_missing_checkpoint_file(tmp_path):
    cfg = DetoxifyConfig(checkpoint=str(tmp_path / "missing.ckpt"), huggingface_config_path=str(tmp_path))
    with pytest.raises(SafetyLoadError, match="safety.text.detoxify"):
        DetoxifyCheck(cfg, "cpu")


def test_checkpoint_naming_a_hub_model_fails_offline_with_a_hint(detoxify_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    released = torch.load(detoxify_dir / "detoxify.ckpt", weights_only=False)
    released["config"]["arch"]["args"]["model_type"] = "no-such-org/no-such-bert"
    torch.save(released, tmp_path / "released.ckpt")
    with pytest.raises(SafetyLoadError, match="detoxify-offline"):
        DetoxifyCheck(DetoxifyConfig(checkpoint=str(tmp_path / "released.ckpt")), "cpu")


def test_threshold_on_a_category_the_model_does_not_score(detoxify_dir):
    cfg = DetoxifyConfig(checkpoint=str(detoxify_dir / "detoxify.ckpt"), huggingface_config_path=str(detoxify_dir),
                         thresholds={"toxicity": 0.8, "sexual_explicit": 0.5})
    with pytest.raises(SafetyLoadError, match=r"thresholds: sexual_explicit not scored"):
        DetoxifyCheck(cfg, "cpu")


def test_custom_factory_that_cannot_be_imported():
    cfg = TextCheckConfig(backend="custom", custom={"factory": "no_such_module:check"})
    with pytest.raises(SafetyLoadError, match="safety.text.custom.factory"):
        build_text_check(cfg)


def test_custom_factory_returning_no_check():
    cfg = TextCheckConfig(backend="custom", custom={"factory": "tests.safety.backends:not_a_check"})
    with pytest.raises(SafetyLoadError, match="no object with check"):
        build_text_check(cfg)
