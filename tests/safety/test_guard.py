"""The guard: self-test at load, checks switched off only by explicit keys, health over a run."""

from __future__ import annotations

import numpy as np

from safety.config import SafetyConfig
from safety.guard import Guard
from safety.policy.prompt_policy import PromptPolicy
from safety.verdicts import Verdict

NOISE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
SOLID = np.full((64, 64, 3), 40, np.uint8)


def config(**sections) -> SafetyConfig:
    base = {"text": {"backend": "profanity"}, "image": {"backend": "custom",
                                                      "custom": {"factory": "tests.safety.backends:flag_all"}}}
    return SafetyConfig.model_validate({**base, **sections})


def test_load_runs_both_checks_and_describes_them(caplog):
    with caplog.at_level("INFO"):
        guard = Guard.load(config())
    assert guard.describe().startswith(f"prompt policy {guard.policy_version} (en/fr/es/de/it/pt/nl/pl/ru/uk/tr/ar/hi/ja/zh/ko/id/vi/sv: sexual_minors,")
    assert guard.describe().endswith("text=alt-profanity-check, image=test, quality=min_std 2.0")
    assert guard.text_check is not None and guard.image_check.calls == 1  # the self-test
    assert "safety checks: prompt policy" in caplog.text and guard.warnings == []


def test_verdicts_come_through():
    guard = Guard.load(config())
    assert guard.screen_prompt("fuck you, you piece of shit").refused
    assert not guard.screen_prompt("a lighthouse at dawn").refused
    assert guard.screen_image(NOISE).refused  # flag_all


def test_switched_off_checks_return_none_and_warn(caplog):
    cfg = config(text={"backend": "off"}, image={"backend": "off"}, quality={"enabled": False})
    with caplog.at_level("WARNING"):
        guard = Guard.load(cfg)
    # The policy lists still run: the classifier is what `backend = "off"` switches off.
    assert guard.screen_prompt("a naked woman").refused and not guard.screen_prompt("anything").refused
    assert guard.screen_image(NOISE) is None
    assert guard.inspect(SOLID, 0).ok
    assert len(guard.warnings) == 3 and caplog.text.count("SAFETY CHECK OFF") == 3
    assert guard.describe().endswith("text=OFF, image=OFF, quality=OFF")


def test_corrupt_outputs_in_a_row_make_the_worker_unhealthy():
    guard = Guard(config(quality={"max_consecutive": 3}), None, None)
    for _ in range(2):
        assert not guard.inspect(SOLID, 0).ok
    assert guard.inspect(NOISE, 0).ok and guard.unhealthy() is None  # a good image resets the run
    for _ in range(3):
        guard.inspect(SOLID, 0)
    assert guard.unhealthy() == "3 corrupt outputs in a row"


class CountingTextCheck:
    """Refuses prompts containing "idiot"; records each call's prompts."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def check(self, prompts):
        self.calls.append(list(prompts))
        return [Verdict.judge(self.name, {"toxic": float("idiot" in p)}, {"toxic": 0.5}) for p in prompts]


def guard_with(text_check, **text) -> Guard:
    cfg = SafetyConfig.model_validate({"text": {"backend": "off", **text}})
    return Guard(cfg, text_check, None, PromptPolicy.load(cfg.text.policy))


def test_a_burst_of_prompts_is_checked_in_one_call_of_its_distinct_prompts_the_lists_pass():
    check = CountingTextCheck()
    guard = guard_with(check)
    prompts = ["a red fox", "you idiot", "a red fox", "a naked woman", "a lighthouse"]
    outcomes = guard.screen_prompts(prompts)
    assert check.calls == [["a red fox", "you idiot", "a lighthouse"]]  # the lists refused the nude
    assert [o.refused for o in outcomes] == [False, True, False, True, False]
    assert outcomes[3].backend != "counting" and outcomes[1].backend == "counting"
    assert all(o.policy == guard.policy_version for o in outcomes)


def test_a_burst_larger_than_the_batch_size_takes_one_call_per_batch():
    check = CountingTextCheck()
    outcomes = guard_with(check, batch_size=2).screen_prompts([f"a fox, take {i}" for i in range(5)])
    assert [len(c) for c in check.calls] == [2, 2, 1] and not any(o.refused for o in outcomes)


def test_a_prompt_checked_before_is_checked_again_nothing_is_remembered_between_calls():
    check = CountingTextCheck()
    guard = guard_with(check)
    guard.screen_prompts(["a red fox"])
    guard.screen_prompts(["a red fox"])
    assert check.calls == [["a red fox"], ["a red fox"]]


def test_a_model_on_a_device_says_where_and_what_it_takes():
    class Placed(CountingTextCheck):
        placement = "original on cuda, 418 MiB"

    assert "text=counting (original on cuda, 418 MiB)" in guard_with(Placed()).describe()
