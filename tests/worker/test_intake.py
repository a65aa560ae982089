"""The lease-ahead intake: rounds of compatible jobs in lease order, the batching window, the bound
on how far it leases ahead."""

from __future__ import annotations

import threading
import time

import pytest

from scheduler.protocol import Lease
from worker.intake import Intake
from worker.validation import Job


def lease(task_id: str) -> Lease:
    return Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                 lease_ttl_s=10.0, attempt=1)


class FakeQueue:
    """Hands out the given (task_id, width) pairs, `per_call` at a time, then nothing."""

    def __init__(self, tasks: list[tuple[str, int]], per_call: int = 100, delay: float = 0.0) -> None:
        self.tasks = list(tasks)
        self.per_call = per_call
        self.delay = delay
        self.asked: list[int] = []
        self.widths = dict(tasks)

    def lease(self, n: int) -> list[Lease]:
        self.asked.append(n)
        time.sleep(self.delay)
        if not self.tasks:
            time.sleep(0.02)  # a long-poll that found nothing
            return []
        out, self.tasks = self.tasks[:min(n, self.per_call)], self.tasks[min(n, self.per_call):]
        return [lease(t) for t, _ in out]

    def admit(self, lease: Lease, timings: dict) -> Job | None:
        if lease.task_id.startswith("bad"):
            return None  # failed and reported by the serve loop
        return Job(task_id=lease.task_id, prompt="p", width=self.widths[lease.task_id], height=64, steps=4,
                   seed=1, output_format="png")


def started(queue: FakeQueue, target: int) -> Intake:
    intake = Intake(queue.lease, queue.admit, target)
    intake.start()
    return intake


def ids(round_) -> list[str]:
    return [a.job.task_id for a in round_]


def test_rounds_group_compatible_jobs_in_lease_order():
    queue = FakeQueue([("a", 64), ("b", 128), ("c", 64), ("d", 64), ("e", 128)])
    intake = started(queue, target=5)
    time.sleep(0.2)
    assert ids(intake.take(capacity=2, window_s=0, wait_s=1)) == ["a", "c"]
    assert ids(intake.take(capacity=2, window_s=0, wait_s=1)) == ["b", "e"]
    assert ids(intake.take(capacity=2, window_s=0, wait_s=1)) == ["d"]
    intake.close(1)


def test_refused_tasks_never_reach_a_round():
    intake = started(FakeQueue([("bad-1", 64), ("a", 64)]), target=4)
    assert ids(intake.take(capacity=4, window_s=0.3, wait_s=1)) == ["a"]
    intake.close(1)


def test_a_partial_round_waits_for_the_window_then_starts():
    queue = FakeQueue([("a", 64), ("b", 64), ("c", 64)], per_call=1, delay=0.15)
    intake = started(queue, target=4)
    t0 = time.monotonic()
    first = intake.take(capacity=4, window_s=0.5, wait_s=2)
    waited = time.monotonic() - t0
    # b and c arrive within the window, a fourth never does: the round starts when the window ends.
    assert ids(first) == ["a", "b", "c"] and 0.5 <= waited < 1.5
    assert first[0].timings["wait"] >= 400 and "lease" in first[0].timings
    intake.close(1)


def test_a_full_round_does_not_wait_for_the_window():
    intake = started(FakeQueue([("a", 64), ("b", 64)]), target=2)
    time.sleep(0.1)
    t0 = time.monotonic()
    assert ids(intake.take(capacity=2, window_s=5, wait_s=1)) == ["a", "b"]
    assert time.monotonic() - t0 < 1
    intake.close(1)


def test_leases_ahead_only_what_one_round_holds():
    queue = FakeQueue([(f"t{i}", 64) for i in range(10)])
    intake = started(queue, target=3)
    time.sleep(0.3)
    assert queue.asked[0] == 3 and len(queue.tasks) == 7  # three held, nothing more leased
    assert len(intake.take(capacity=2, window_s=0, wait_s=1)) == 2
    time.sleep(0.3)
    assert len(queue.tasks) == 5 and all(n <= 3 for n in queue.asked)
    intake.close(1)


def test_take_returns_empty_after_its_wait_or_a_nudge():
    intake = started(FakeQueue([]), target=2)
    t0 = time.monotonic()
    assert intake.take(capacity=2, window_s=0, wait_s=0.3) == []
    assert time.monotonic() - t0 >= 0.3
    threading.Timer(0.1, intake.nudge).start()
    t0 = time.monotonic()
    assert intake.take(capacity=2, window_s=0, wait_s=10) == []
    assert time.monotonic() - t0 < 2
    intake.close(1)


def test_a_failing_lease_thread_surfaces_in_the_serve_loop():
    def lease_fails(n):
        raise PermissionError("scheduler refused this worker")

    intake = Intake(lease_fails, lambda lease, t: None, target=2)
    intake.start()
    with pytest.raises(PermissionError):
        intake.take(capacity=2, window_s=0, wait_s=2)


def test_close_hands_back_what_was_ready_and_drains():
    intake = started(FakeQueue([("a", 64), ("b", 64)]), target=2)
    time.sleep(0.2)
    assert sorted(ids(intake.close(1))) == ["a", "b"]
    assert intake.drained()
