"""Rank 0's pipeline in a one-rank group: post-processing overlaps, reports stay in lease order."""

from __future__ import annotations

import threading
import time

import numpy as np

from safety.config import SafetyConfig
from safety.guard import Guard
from scheduler.protocol import Lease, TaskResult
from worker.config import WorkerConfig
from worker.finish import Done, failure
from worker.intake import Admitted
from worker.lockstep import Outcome
from worker.serve import Coordinator
from worker.validation import Job


class RecordingClient:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []

    def report(self, task_id, rep, deadline_s):
        self.reports.append((task_id, rep.status))


class SlowFirstFinisher:
    """The first task's post-processing takes longest: it finishes last."""

    def __init__(self, delays: dict[str, float]) -> None:
        self.delays = delays
        self.finished: list[str] = []
        self._lock = threading.Lock()

    def run(self, lease, job, out) -> Done:
        time.sleep(self.delays[job.task_id])
        with self._lock:
            self.finished.append(job.task_id)
        if job.task_id == "c":
            return failure("storage_unavailable", "down", retryable=True)
        return Done(result=TaskResult(uri=f"file:///{job.task_id}.png", content_type="image/png", width=64,
                                      height=64, seed=1, bytes=1, sha256="0"))


def coordinator(ctx, client) -> Coordinator:
    cfg = WorkerConfig.model_validate({"storage": {"workers": 3, "max_pending": 8}})
    guard = Guard(SafetyConfig.model_validate({"text": {"backend": "off"}, "image": {"backend": "off"}}), None, None)
    return Coordinator(cfg, ctx, client, store=None, guard=guard)


def submit(coord: Coordinator, task_id: str) -> None:
    lease = Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                  lease_ttl_s=10.0, attempt=1)
    job = Job(task_id=task_id, prompt="p", width=64, height=64, steps=1, seed=1, output_format="png")
    coord._finish(Admitted(lease, job), Outcome(np.zeros((64, 64, 3), np.uint8), [], 0.1), sent_ms=0.0)


def test_reports_follow_lease_order_while_post_processing_overlaps(ctx):
    client = RecordingClient()
    coord = coordinator(ctx, client)
    coord.finisher = SlowFirstFinisher({"a": 0.6, "b": 0.0, "c": 0.1})
    t0 = time.monotonic()
    for task_id in "abc":
        submit(coord, task_id)
    assert time.monotonic() - t0 < 0.3  # handing over does not wait for post-processing
    coord._settle(limit=0)
    assert coord.finisher.finished[0] == "b"  # b finished first...
    assert client.reports == [("a", "succeeded"), ("b", "succeeded"), ("c", "failed")]  # ...reported after a
    coord._post.shutdown()


def test_settle_reports_what_is_done_and_leaves_the_rest(ctx):
    client = RecordingClient()
    coord = coordinator(ctx, client)
    coord.finisher = SlowFirstFinisher({"a": 0.0, "b": 1.0})
    submit(coord, "a")
    submit(coord, "b")
    time.sleep(0.2)
    coord._settle(limit=1)
    assert client.reports == [("a", "succeeded")] and len(coord._pending) == 1
    coord._settle(limit=0)
    assert client.reports == [("a", "succeeded"), ("b", "succeeded")]
    coord._post.shutdown()
