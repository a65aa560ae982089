"""The watchdog holds stages to their deadlines and exits a stalled serve loop, on an injected clock."""

from __future__ import annotations

from protocol import Lease
from worker.config import DeadlinesConfig
from worker.serving.heartbeat import WorkerState
from worker.serving.task import Task
from worker.serving.watchdog import STALLED_EXIT, Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingReporter:
    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.sent: list[tuple[str, str, str]] = []

    def fail(self, task, code, message, *, retryable, deadline_s=None):
        assert retryable
        self.sent.append((task.id, str(code), message))
        self.state.end(task)

    def release(self, task, deadline_s=None):
        self.sent.append((task.id, "released", ""))
        self.state.end(task)


def task(task_id: str) -> Task:
    return Task(Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                      lease_ttl_s=10.0, attempt=1))


def setup():
    clock = Clock()
    state = WorkerState(clock=clock)
    reporter = RecordingReporter(state)
    exits: list[int] = []
    dog = Watchdog(state, reporter, DeadlinesConfig(store_s=5, stall_s=300), exit=exits.append)
    return clock, state, reporter, exits, dog


def tick(dog: Watchdog) -> None:
    """One pass of the watchdog's loop, without its thread."""
    dog.check()


def test_a_stage_past_its_deadline_fails_its_task_at_once_and_only_it():
    clock, state, reporter, exits, dog = setup()
    hung, moving = task("hung"), task("moving")
    state.begin(hung, "store", 5)
    state.begin(moving, "generate", 120)
    clock.now += 5
    tick(dog)
    assert reporter.sent == []  # held up to its deadline, inclusive
    clock.now += 0.5
    tick(dog)
    assert reporter.sent == [("hung", "deadline_exceeded", "stage store took longer than 5s (deadlines.store_s)")]
    assert hung.abandoned and state.is_lost(hung) and not moving.abandoned
    assert state.snapshot().in_flight == ["moving"] and exits == []
    tick(dog)
    assert len(reporter.sent) == 1  # failed once


def test_a_task_that_moves_on_gets_its_next_stages_deadline():
    clock, state, reporter, exits, dog = setup()
    t = task("t")
    state.begin(t, "check", 30)
    clock.now += 29
    state.stage(t, "store", 5)
    clock.now += 4
    tick(dog)
    assert reporter.sent == [] and state.snapshot().in_flight == ["t"]


def test_a_stalled_serve_loop_gives_its_tasks_back_and_exits():
    clock, state, reporter, exits, dog = setup()
    waiting, generating = task("waiting"), task("generating")
    state.begin(waiting, "ready", 300)
    state.begin(generating, "generate", 400)
    state.progress()
    clock.now += 299
    tick(dog)
    assert exits == []
    clock.now += 2
    state.stage(generating, "generate", 400)  # its own deadline is far: the loop's stall decides
    tick(dog)
    assert exits == [STALLED_EXIT]
    assert sorted(reporter.sent) == [("generating", "deadline_exceeded",
                                      "the worker's serve loop stalled in stage generate"),
                                     ("waiting", "released", "")]
    assert state.held() == []
