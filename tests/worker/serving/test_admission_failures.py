"""A text check that fails fails its prompts as retryable, never passes them to the GPU."""

from __future__ import annotations

from protocol import ErrorCode
from safety.config import SafetyConfig
from safety.guard import Guard
from safety.policy.prompt_policy import PromptPolicy
from worker.config import LimitsConfig
from worker.serving.admission import Admission
from worker.serving.ledger import Ledger
from tests.worker.serving.test_admission import FakeReporter, task


class Raising:
    name = "raising"

    def check(self, prompts):
        raise RuntimeError("out of memory")


def test_a_failing_text_check_fails_every_prompt_of_its_call_retryable_and_admits_none():
    reporter = FakeReporter()
    cfg = SafetyConfig.model_validate({"text": {"backend": "off"}})
    gate = Admission(LimitsConfig(), Guard(cfg, Raising(), None, PromptPolicy.load(cfg.text.policy)), reporter,
                     Ledger())
    assert gate.admit([task("a", prompt="a red fox"), task("b", prompt="an owl")]) == []
    assert reporter.failed == {"a": ErrorCode.SAFETY_CHECK_FAILED, "b": ErrorCode.SAFETY_CHECK_FAILED}
    assert reporter.retryable == {"a": True, "b": True} and reporter.processing == []
