"""Admission on a worker of several models: each task is validated against its own model's limits,
gets its model in its job (the one loaded at start when the lease names none), and a task of a
model the worker does not serve, or whose load failed, fails retryable."""

from __future__ import annotations

from protocol import ErrorCode, Lease
from tests.harness import Clock
from tests.worker.serving.test_admission import admission
from worker.config import LimitsConfig, ModelConfig
from worker.serving.state import WorkerState
from worker.serving.swapping import Models
from worker.serving.task import Task


def task(task_id: str, model: str | None, width: int) -> Task:
    return Task(Lease(task_id=task_id, input={"prompt": "a fox", "width": width, "height": 256}, created_at=0.0,
                      lease_token="tok", lease_deadline=0.0, lease_ttl_s=10.0, attempt=1, model=model))


def gate_of_two_models():
    gate, _, reporter = admission()
    gate.models = Models({"flux": ModelConfig(name="flux"), "pixart": ModelConfig(name="pixart")}, 0,
                         WorkerState(), Clock())
    gate.model_limits = {"pixart": LimitsConfig(max_side=512, default_width=512, default_height=512)}
    return gate, reporter


def test_each_task_is_validated_against_its_own_models_limits_and_carries_its_model():
    gate, reporter = gate_of_two_models()
    admitted = gate.admit([task("big-flux", "flux", 1024), task("big-pixart", "pixart", 1024),
                           task("small-pixart", "pixart", 256), task("named-none", None, 256)])
    assert [(t.id, t.job.model) for t in admitted] == [("big-flux", "flux"), ("small-pixart", "pixart"),
                                                        ("named-none", "flux")]
    assert reporter.failed == {"big-pixart": ErrorCode.INVALID_REQUEST}


def test_a_model_it_does_not_serve_or_that_failed_to_load_fails_retryable():
    gate, reporter = gate_of_two_models()
    gate.models.failed("pixart", (), "rank 0: OSError")
    assert gate.admit([task("other", "sana", 256), task("failed", "pixart", 256)]) == []
    assert reporter.failed == {"other": ErrorCode.MODEL_UNAVAILABLE, "failed": ErrorCode.MODEL_UNAVAILABLE}
    assert reporter.retryable == {"other": True, "failed": True}
