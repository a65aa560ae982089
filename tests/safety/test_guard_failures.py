"""Fail closed: a check that raises, hangs or answers wrongly fails the task, never passes it; a
check that cannot run at start stops the worker from becoming ready; runs of failures make it exit."""

from __future__ import annotations

import time

import numpy as np
import pytest

from safety.config import SafetyConfig
from safety.guard import Guard
from safety.policy.prompt_policy import PromptPolicy
from safety.verdicts import CheckFailed, SafetyLoadError, Verdict

IMAGE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)


def guard_with_image_backend(factory: str, **options) -> Guard:
    cfg = SafetyConfig.model_validate({
        "text": {"backend": "off"}, "timeout_s": 0.5, "max_consecutive_errors": 3,
        "image": {"backend": "custom", "custom": {"factory": f"tests.safety.backends:{factory}",
                                                  "options": options}}})
    return Guard.load(cfg)


def test_a_raising_check_fails_the_call():
    guard = guard_with_image_backend("raising")
    with pytest.raises(CheckFailed, match="image check raised RuntimeError: classifier exploded"):
        guard.screen_image(IMAGE)


def test_a_hung_check_times_out_and_is_abandoned():
    guard = guard_with_image_backend("slow", seconds=30.0)
    t0 = time.monotonic()
    with pytest.raises(CheckFailed, match="timed out after 0.5s"):
        guard.screen_image(IMAGE)
    assert time.monotonic() - t0 < 5


def test_a_check_answering_for_the_wrong_number_of_images_fails():
    with pytest.raises(CheckFailed, match="not one verdict per input"):
        guard_with_image_backend("wrong_count").screen_image(IMAGE)


def test_failures_in_a_row_make_the_worker_unhealthy_and_a_success_resets():
    guard = guard_with_image_backend("raising")
    for _ in range(3):
        with pytest.raises(CheckFailed):
            guard.screen_image(IMAGE)
    assert guard.unhealthy() == "3 safety check failures in a row"


def test_a_check_that_cannot_run_stops_start_up():
    with pytest.raises(SafetyLoadError, match="self-test failed: image check raised"):
        guard_with_image_backend("raising", healthy_calls=0)


def test_a_model_that_cannot_load_stops_start_up():
    cfg = SafetyConfig.model_validate({"image": {"nudenet": {"labels": ("NOT_A_LABEL",)}}, "text": {"backend": "off"}})
    with pytest.raises(SafetyLoadError, match="safety.image.nudenet.labels"):
        Guard.load(cfg)


def test_a_text_check_failing_on_one_batch_fails_that_batchs_prompts_and_no_others():
    class FailsOnSecondCall:
        name = "flaky"

        def __init__(self) -> None:
            self.calls = 0

        def check(self, prompts):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("device lost")
            return [Verdict(False, self.name) for _ in prompts]

    cfg = SafetyConfig.model_validate({"text": {"backend": "off", "batch_size": 2}})
    guard = Guard(cfg, FailsOnSecondCall(), None, PromptPolicy.load(cfg.text.policy))
    outcomes = guard.screen_prompts(["a fox", "a cat", "a dog", "a naked woman", "an owl"])
    # dog and owl, the lists' passes after fox and cat, were the second batch
    assert [type(o).__name__ for o in outcomes] == ["Verdict", "Verdict", "CheckFailed", "Verdict", "CheckFailed"]
    assert "text check raised RuntimeError: device lost" in str(outcomes[2])
    assert outcomes[3].refused  # refused by the lists, whatever the text check did
    guard.text_check.calls = 1  # the next call fails: for one prompt alone, the failure is raised
    with pytest.raises(CheckFailed, match="device lost"):
        guard.screen_prompt("a fox")
