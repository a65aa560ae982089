"""The lease-ahead intake: rounds planned from what is ready (worker.serving.rounds), the batching window, the bound on how
far it leases ahead. The fake queue tells the tests, through events, when the intake has asked it
again (so everything before is admitted); no test sleeps on the wall clock to let a thread run."""

from __future__ import annotations

import threading
import time

import pytest

from protocol import Lease
from worker.model.job import Job
from worker.serving.intake import Intake
from worker.serving.task import Task


def lease(task_id: str) -> Lease:
    return Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                 lease_ttl_s=10.0, attempt=1)


class FakeQueue:
    """Hands out the given (task_id, width) pairs, `per_call` at a time. Once they are all out, a
    call waits (like an empty long poll) until the test adds more or the intake stops."""

    def __init__(self, tasks: list[tuple[str, int]], per_call: int = 100) -> None:
        self.tasks = list(tasks)
        self.per_call = per_call
        self.widths = dict(tasks)
        self.asked: list[int] = []
        self.cond = threading.Condition()

    def wake(self) -> None:
        pass

    def lease(self, n: int, hungry: bool = True, wake=None) -> list[Lease]:
        with self.cond:
            self.asked.append(n)
            self.cond.notify_all()
            if not self.tasks:
                self.cond.wait(0.05)  # an empty long poll
            out, self.tasks = self.tasks[:min(n, self.per_call)], self.tasks[min(n, self.per_call):]
        return [lease(t) for t, _ in out]

    def pending(self) -> int:
        return 0

    def admit(self, tasks: list[Task]) -> list[Task]:
        admitted = [t for t in tasks if not t.id.startswith("bad")]  # "bad...": failed and reported
        for task in admitted:
            task.job = Job(task_id=task.id, prompt="p", width=self.widths[task.id], height=64, steps=4, seed=1,
                           output_format="png")
        return admitted

    def add(self, tasks: list[tuple[str, int]]) -> None:
        with self.cond:
            self.tasks += tasks
            self.widths.update(tasks)
            self.cond.notify_all()

    def wait_asked(self, calls: int, timeout: float = 5.0) -> None:
        """Until the intake has called lease `calls` times: what earlier calls gave is admitted."""
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.asked) >= calls, timeout), self.asked


def started(queue: FakeQueue, target: int) -> Intake:
    intake = Intake(queue, queue, target)
    intake.start()
    return intake


def ids(round_) -> list[str]:
    return [t.id for batch in round_ for t in batch]


def take(intake: Intake, capacity: int, window_s: float = 0, wait_s: float = 1, slots: int = 1):
    """A round of one slot holding up to `capacity` tasks of one shape (one rank, batch capacity)."""
    return intake.take(slots, capacity, window_s, wait_s)


def test_rounds_group_one_shape_in_lease_order():
    queue = FakeQueue([("a", 64), ("b", 128), ("c", 64), ("d", 64), ("e", 128)])
    intake = started(queue, target=6)
    queue.wait_asked(2)  # the second call comes after the first five were admitted
    assert ids(take(intake, 2, 0, 1)) == ["a", "c"]
    assert ids(take(intake, 2, 0, 1)) == ["b", "e"]
    assert ids(take(intake, 2, 0, 1)) == ["d"]
    intake.close(1)


def test_each_rank_of_a_round_takes_its_own_shape():
    queue = FakeQueue([("a", 64), ("b", 128), ("c", 64), ("d", 192)])
    intake = started(queue, target=5)
    queue.wait_asked(2)
    # Two ranks, one image each: the oldest (a), then the one of its cost (c) rather than a bigger one.
    assert [ids([b]) for b in intake.take(2, 1, 0, 1)] == [["a"], ["c"]]
    assert [ids([b]) for b in intake.take(2, 1, 0, 1)] == [["b"], ["d"]]
    intake.close(1)


def test_refused_tasks_never_reach_a_round():
    intake = started(FakeQueue([("bad-1", 64), ("a", 64)]), target=4)
    assert ids(take(intake, 4, 0.3, 1)) == ["a"]
    intake.close(1)


def test_a_partial_round_waits_for_the_window_then_starts():
    queue = FakeQueue([("a", 64)], per_call=1)
    intake = started(queue, target=4)
    threading.Timer(0.1, queue.add, [[("b", 64), ("c", 64)]]).start()
    t0 = time.monotonic()
    first = take(intake, 4, 0.5, 2)
    waited = time.monotonic() - t0
    # b and c arrive within the window, a fourth never does: the round starts when the window ends.
    assert ids(first) == ["a", "b", "c"] and 0.4 <= waited < 1.5
    timings = first[0][0].timings.as_dict()
    assert timings["wait"] >= 400 and "lease" in timings
    intake.close(1)


def test_a_full_round_does_not_wait_for_the_window():
    queue = FakeQueue([("a", 64), ("b", 64)])
    intake = started(queue, target=3)
    queue.wait_asked(2)
    t0 = time.monotonic()
    assert ids(take(intake, 2, 5, 1)) == ["a", "b"]
    assert time.monotonic() - t0 < 1
    intake.close(1)


def test_leases_ahead_only_what_one_round_holds():
    queue = FakeQueue([(f"t{i}", 64) for i in range(10)])
    intake = started(queue, target=3)
    queue.wait_asked(1)
    with intake._cond:  # three held, nothing more leased until some are taken
        assert intake._cond.wait_for(lambda: len(intake._ready) == 3, 5)
    assert queue.asked == [3] and len(queue.tasks) == 7
    assert len(ids(take(intake, 2, 0, 1))) == 2
    queue.wait_asked(2)
    assert queue.asked[1] == 2 and all(n <= 3 for n in queue.asked)
    intake.close(1)


def test_take_returns_empty_after_its_wait_or_a_nudge():
    intake = started(FakeQueue([]), target=2)
    t0 = time.monotonic()
    assert take(intake, 2, 0, 0.3) == []
    assert time.monotonic() - t0 >= 0.3
    threading.Timer(0.1, intake.nudge).start()
    t0 = time.monotonic()
    assert take(intake, 2, 0, 10) == []
    assert time.monotonic() - t0 < 2
    intake.close(1)


def test_a_failing_lease_thread_surfaces_in_the_serve_loop():
    class Refused:
        def wake(self):
            pass

        def lease(self, n, hungry=True, wake=None):
            raise PermissionError("scheduler refused this worker")

    intake = Intake(Refused(), FakeQueue([]), target=2)
    intake.start()
    with pytest.raises(PermissionError):
        take(intake, 2, 0, 2)


def test_close_hands_back_what_was_ready_and_drains():
    queue = FakeQueue([("a", 64), ("b", 64)])
    intake = started(queue, target=3)
    queue.wait_asked(2)
    assert sorted(t.id for t in intake.close(1)) == ["a", "b"]
    assert intake.drained()


def test_withdraw_takes_the_picked_tasks_out_of_the_next_round():
    from worker.serving.intake import Intake

    intake = Intake(leases=None, gate=None, target=4)
    tasks = [Task(Lease(task_id=t, input={}, created_at=0.0, lease_token="x", lease_deadline=0.0, lease_ttl_s=1.0,
                        attempt=1)) for t in "abc"]
    intake._ready = list(tasks)  # admitted, waiting for a round
    assert [t.id for t in intake.withdraw(lambda t: t.id != "b")] == ["a", "c"]
    assert [t.id for t in intake._ready] == ["b"] and intake.withdraw(lambda t: False) == []
