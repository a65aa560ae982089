"""Content safety end to end: the real scheduler on 127.0.0.1, 2-rank torchrun workers (gloo), the
real safety backends (alt-profanity-check, a Hugging Face ViT classifier, NudeNet)."""

from __future__ import annotations


import pytest

from tests.harness import Stack, run, settled_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

OFFENSIVE = "fuck you, you piece of shit"


@pytest.fixture(scope="module")
def flagging(tmp_path_factory, tiny_model, vit_dir):
    """A worker whose image classifier is configured to flag everything, with a quarantine."""
    stack = Stack(tmp_path_factory.mktemp("flagging"), tiny_model)
    stack.quarantine = stack.tmp / "quarantine"
    stack.proc = stack.worker(nproc=2, overrides=[
        "safety.text.backend=profanity",  # alt-profanity-check's shipped model, for real
        "safety.image.backend=hf", f"safety.image.hf.model={vit_dir}", "safety.image.hf.threshold=0.0",
        f"storage.quarantine.local.root={stack.quarantine}"])
    yield stack
    stack.close()


def test_refused_prompt_fails_unsafe_prompt_without_inference(flagging):
    before = settled_worker(flagging)["counters"]
    (task,) = run(flagging, [{"prompt": OFFENSIVE}])
    assert task["status"] == "failed" and task["attempts"] == 1
    err = task["error"]
    assert err["code"] == "unsafe_prompt" and err["retryable"] is False
    assert err["details"]["category"] == "profanity" and err["details"]["score"] >= 0.9
    assert "profanity scored" in err["message"]
    after = settled_worker(flagging)["counters"]
    assert after["images_generated"] == before["images_generated"]  # the GPU never saw it
    assert after["prompts_refused"] == before.get("prompts_refused", 0) + 1


def test_the_policy_refuses_first_names_its_version_and_never_echoes_the_prompt(flagging):
    before = settled_worker(flagging)["counters"]
    (task,) = run(flagging, [{"prompt": "une femme n.u.e sur un lit"}])  # French, spelled out
    err = task["error"]
    assert err["code"] == "unsafe_prompt" and err["retryable"] is False
    version = settled_worker(flagging)["safety_policy"]  # from the worker's heartbeats
    assert version and err["details"]["policy"] == version
    assert err["details"]["backend"] == "policy" and err["details"]["category"] == "sexual"
    assert err["message"] == f"prompt refused: sexual content (sexual; policy {version})"
    after = settled_worker(flagging)["counters"]
    assert after["images_generated"] == before["images_generated"]
    # A classifier's refusal names the policy version too: every prompt passed through it first.
    (task,) = run(flagging, [{"prompt": OFFENSIVE}])
    assert task["error"]["details"]["policy"] == version


def test_flagged_image_fails_unsafe_image_and_is_never_stored(flagging):
    before = settled_worker(flagging)["counters"]
    (task,) = run(flagging, [{"prompt": "a lighthouse on a cliff", "width": 128, "height": 128}])
    assert task["status"] == "failed" and task["attempts"] == 1 and task["result"] is None
    err = task["error"]
    assert err["code"] == "unsafe_image" and err["retryable"] is False
    assert err["details"]["category"] == "nsfw" and set(err["details"]["scores"]) == {"normal", "nsfw"}
    assert flagging.objects() == []  # nothing in the results location
    assert [p.name for p in flagging.quarantine.glob("*.jpg")] == [f"{task['id']}.jpg"]
    after = settled_worker(flagging)["counters"]
    assert after["images_generated"] == before["images_generated"] + 1
    assert after["images_refused"] == before.get("images_refused", 0) + 1
