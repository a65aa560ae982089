"""Safety failure paths end to end: checks that raise, outputs that are corrupt, models that do not
load. Whatever fails, no task succeeds unchecked, none is lost, and the worker exits when it is the
thing that is broken so that its supervisor restarts it. A check that raises runs on a group of two ranks,
to see the whole group leave; the others on one rank, since what they test is rank 0's."""

from __future__ import annotations

import pytest

from tests.harness import run, settled_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.fixture(scope="module")
def solid_model(tmp_path_factory):
    """The tiny pipeline with its VAE's last convolution zeroed: every image is one flat colour,
    as a corrupted device context draws them."""
    import torch

    from launch.tiny_model import build_tiny_pipeline

    pipe = build_tiny_pipeline()
    with torch.no_grad():
        pipe.vae.decoder.conv_out.weight.zero_()
        pipe.vae.decoder.conv_out.bias.copy_(torch.tensor([0.2, -0.3, 0.5]))
    out = tmp_path_factory.mktemp("models") / "solid-flux"
    pipe.save_pretrained(out)
    return out


def test_raising_classifier_fails_retryable_never_succeeds_then_worker_exits(make_stack):
    stack = make_stack(max_attempts=2)
    proc = stack.worker(nproc=2, overrides=[
        "safety.image.backend=custom", "safety.image.custom.factory=tests.safety.backends:raising",
        "safety.text.backend=off", "safety.max_consecutive_errors=3"])
    (task,) = run(stack, [{"prompt": "a red fox", "width": 128, "height": 128}], proc=proc)
    assert task["status"] == "failed" and task["attempts"] == 2  # retried, then out of attempts
    err = task["error"]
    assert err["code"] == "safety_check_failed" and err["retryable"] is True
    assert "classifier exploded" in err["message"]
    assert stack.objects() == []
    # A check switched off by config is reported in every heartbeat.
    assert settled_worker(stack, beats=1)["warnings"] == ['safety.text.backend = "off": prompts are checked by the policy lists alone']
    assert 'SAFETY CHECK OFF: safety.text.backend = "off"' in proc.messages()
    # The third failure in a row: the worker exits for its supervisor to restart it.
    task_id = stack.client.submit({"prompt": "a blue whale", "width": 128, "height": 128})["id"]
    assert proc.wait(60) != 0
    assert "3 safety check failures in a row" in proc.output()
    task = stack.client.task(task_id)  # back in the queue for a healthy worker, not lost
    assert task["status"] == "queued" and task["error"]["code"] == "safety_check_failed"
    assert stack.objects() == []


def test_solid_colour_outputs_are_retried_and_then_the_worker_exits(make_stack, solid_model):
    stack = make_stack(max_attempts=3)
    proc = stack.worker(nproc=1, overrides=[f"model.source={solid_model}", "safety.quality.max_consecutive=3"])
    task_id = stack.client.submit({"prompt": "a lighthouse", "width": 128, "height": 128})["id"]
    assert proc.wait(120) != 0  # three corrupt outputs in a row
    task = stack.client.task(task_id)
    assert task["status"] == "failed" and task["attempts"] == 3  # retried each time, never delivered
    err = task["error"]
    assert err["code"] == "corrupt_output" and err["retryable"] is True and "nearly solid" in err["message"]
    assert stack.objects() == []
    assert "unhealthy: 3 corrupt outputs in a row" in proc.output()


def test_a_safety_model_that_does_not_load_keeps_the_worker_from_ready(make_stack):
    stack = make_stack()
    proc = stack.worker(nproc=1, overrides=['safety.image.nudenet.labels=["BUTOCKS_EXPOSED"]'])
    assert proc.wait(120) != 0
    assert stack.registered() == []  # never registered, never leased anything
    assert "not starting: safety.image.nudenet.labels: BUTOCKS_EXPOSED" in proc.output()
