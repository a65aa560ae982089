"""The prompt checks with their real backends: detoxify loaded fully offline from a checkpoint built
at test time, and alt-profanity-check with the model that ships in its wheel."""

from __future__ import annotations

import pytest
import torch

from safety.config import DetoxifyConfig, ProfanityConfig, TextCheckConfig
from safety.text import DetoxifyCheck, ProfanityCheck, build_text_check, make_offline_checkpoint

CATEGORIES = {"toxicity", "severe_toxicity", "obscene", "threat", "insult", "identity_attack"}


@pytest.fixture
def offline(monkeypatch):
    """No hub, no torch.hub download: any attempt to reach the network fails the test."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def no_download(*a, **kw):
        raise AssertionError("detoxify tried to download its checkpoint")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)


def detoxify(detoxify_dir, **thresholds) -> DetoxifyCheck:
    cfg = DetoxifyConfig(checkpoint=str(detoxify_dir / "detoxify.ckpt"),
                         huggingface_config_path=str(detoxify_dir), **({"thresholds": thresholds} if thresholds else {}))
    return DetoxifyCheck(cfg, "cpu")


def test_detoxify_loads_offline_and_scores_every_category(detoxify_dir, offline):
    verdicts = detoxify(detoxify_dir).check(["a lighthouse on a cliff at dawn", "you are a stupid idiot"])
    assert len(verdicts) == 2
    for v in verdicts:
        assert set(v.scores) == CATEGORIES and all(0.0 <= s <= 1.0 for s in v.scores.values())
    assert verdicts[0].scores != verdicts[1].scores  # the model reads its input


def test_detoxify_batch_of_one_matches_the_batch(detoxify_dir, offline):
    check = detoxify(detoxify_dir)
    one = check.check(["a red fox in the snow"])[0]
    both = check.check(["a red fox in the snow", "hello world"])[0]
    assert one.scores == pytest.approx(both.scores, abs=1e-5)


def test_detoxify_refuses_at_the_threshold_and_names_the_worst_category(detoxify_dir, offline):
    prompt = "portrait of an old sailor"
    scores = detoxify(detoxify_dir).check([prompt])[0].scores
    worst = max(scores, key=scores.get)
    refusing = detoxify(detoxify_dir, **{worst: scores[worst] - 1e-4})
    v = refusing.check([prompt])[0]
    assert v.refused and v.category == worst and v.score == pytest.approx(scores[worst])
    assert worst in v.describe() and v.details()["category"] == worst
    passing = detoxify(detoxify_dir, **{worst: min(1.0, scores[worst] + 1e-3)})
    assert not passing.check([prompt])[0].refused


def test_released_checkpoint_made_offline_ready(detoxify_dir, tmp_path, offline):
    # A released checkpoint names a Hub model; the rewritten copy names the local directory.
    released = torch.load(detoxify_dir / "detoxify.ckpt", weights_only=False)
    released["config"]["arch"]["args"]["model_type"] = "bert-base-uncased"
    torch.save(released, tmp_path / "released.ckpt")
    fixed = make_offline_checkpoint(tmp_path / "released.ckpt", detoxify_dir, tmp_path / "offline.ckpt")
    cfg = DetoxifyConfig(checkpoint=str(fixed), huggingface_config_path=str(detoxify_dir))
    assert len(DetoxifyCheck(cfg, "cpu").check(["hello"])) == 1


def test_profanity_check_on_known_clean_and_offensive_strings():
    check = ProfanityCheck(ProfanityConfig(threshold=0.9))
    clean = ["a lighthouse on a cliff at dawn", "a portrait of a cat", "watercolor of a mountain lake"]
    offensive = ["fuck you, you piece of shit", "you are a stupid idiot"]
    verdicts = check.check(clean + offensive)
    assert [v.refused for v in verdicts] == [False] * 3 + [True] * 2
    assert verdicts[3].category == "profanity" and verdicts[3].score >= 0.9
    assert check.check([]) == []


def test_auto_uses_detoxify_when_its_checkpoint_exists(detoxify_dir, offline):
    cfg = TextCheckConfig(backend="auto", detoxify=DetoxifyConfig(
        checkpoint=str(detoxify_dir / "detoxify.ckpt"), huggingface_config_path=str(detoxify_dir)))
    assert build_text_check(cfg).name == "detoxify"


def test_auto_without_a_detoxify_checkpoint_leaves_the_policy_alone(tmp_path, caplog):
    cfg = TextCheckConfig(backend="auto", detoxify=DetoxifyConfig(checkpoint=str(tmp_path / "none.ckpt")))
    with caplog.at_level("INFO"):
        assert build_text_check(cfg) is None
    assert "the policy alone (lists and learned layer): no detoxify checkpoint at" in caplog.text


def test_off_builds_nothing():
    assert build_text_check(TextCheckConfig(backend="off")) is None


def test_detoxify_says_where_it_runs_and_what_its_weights_take(detoxify_dir, offline):
    check = detoxify(detoxify_dir)
    params = sum(p.numel() * p.element_size() for p in check._model.model.parameters())
    assert check.placement.startswith("original on cpu, ") and check.placement.endswith(" MiB")
    assert float(check.placement.split(", ")[1].split()[0]) == pytest.approx(params / 2**20, abs=0.06)
