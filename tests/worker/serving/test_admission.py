"""Rank 0's gate: the tasks of one lease call are validated one by one, their prompts checked
together in one call of the text check, and those that pass reported `processing` together."""

from __future__ import annotations

from protocol import ErrorCode, Lease
from safety.config import SafetyConfig
from safety.guard import Guard
from safety.policy.prompt_policy import PromptPolicy
from tests.safety.test_guard import CountingTextCheck
from worker.config import LimitsConfig
from worker.serving.admission import Admission
from worker.serving.ledger import Ledger
from worker.serving.task import Task


class FakeReporter:
    def __init__(self) -> None:
        self.failed: dict[str, ErrorCode] = {}
        self.retryable: dict[str, bool] = {}
        self.processing: list[list[str]] = []

    def processing_all(self, tasks):
        self.processing.append([t.id for t in tasks])
        return tasks

    def fail(self, task, code, message, *, retryable, details=None, deadline_s=None):
        self.failed[task.id] = code
        self.retryable[task.id] = retryable


def task(task_id: str, **input) -> Task:
    return Task(Lease(task_id=task_id, input={"width": 256, "height": 256, **input}, created_at=0.0,
                      lease_token="tok", lease_deadline=0.0, lease_ttl_s=10.0, attempt=1))


def admission() -> tuple[Admission, CountingTextCheck, FakeReporter]:
    check, reporter = CountingTextCheck(), FakeReporter()
    cfg = SafetyConfig.model_validate({"text": {"backend": "off"}})
    guard = Guard(cfg, check, None, PromptPolicy.load(cfg.text.policy))
    return Admission(LimitsConfig(), guard, reporter, Ledger()), check, reporter


def test_a_lease_calls_prompts_go_to_the_text_check_in_one_call_and_each_task_gets_its_own_verdict():
    gate, check, reporter = admission()
    tasks = [task("a", prompt="a red fox"), task("b", prompt="you idiot"), task("c", prompt=""),
             task("d", prompt="a lighthouse at dawn")]
    admitted = gate.admit(tasks)
    assert [t.id for t in admitted] == ["a", "d"]
    assert check.calls == [["a red fox", "you idiot", "a lighthouse at dawn"]]  # "c" failed validation first
    assert reporter.failed == {"b": ErrorCode.UNSAFE_PROMPT, "c": ErrorCode.INVALID_REQUEST}
    assert reporter.processing == [["a", "d"]]
    # The check's time is the call's, shared like a batch's stages, and recorded before the report.
    assert tasks[0].timings.as_dict()["text_check"] == tasks[1].timings.as_dict()["text_check"]


def test_a_prompt_seen_before_is_checked_again_whatever_the_model_cached():
    gate, check, _ = admission()
    gate.admit([task("a", prompt="a red fox")])
    gate.admit([task("b", prompt="a red fox")])  # its embedding may come from the engine's cache
    assert check.calls == [["a red fox"], ["a red fox"]]
