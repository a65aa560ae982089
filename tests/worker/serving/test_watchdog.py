"""The watchdog holds stages to their deadlines and exits a stalled serve loop, on an injected clock."""

from __future__ import annotations

from protocol import Lease
from worker.config import DeadlinesConfig
from worker.serving.ledger import Fate, Ledger, Stage, stage_limits
from worker.serving.state import WorkerState
from worker.serving.task import Task
from worker.serving.watchdog import STALLED_EXIT, Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingReporter:
    """Records each report with the fate its task had when the watchdog sent it, and ends it, as
    the reporter does."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.sent: list[tuple[str, str, str]] = []
        self.fates: dict[str, Fate] = {}

    def fail(self, task, code, message, *, retryable, deadline_s=None):
        assert retryable
        self.sent.append((task.id, str(code), message))
        self.fates[task.id] = self.ledger.fate(task)
        self.ledger.end(task)

    def release(self, task, deadline_s=None):
        self.sent.append((task.id, "released", ""))
        self.fates[task.id] = self.ledger.fate(task)
        self.ledger.end(task)


def task(task_id: str) -> Task:
    return Task(Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                      lease_ttl_s=10.0, attempt=1))


def setup(limits: dict[Stage, float] | None = None):
    clock = Clock()
    state = WorkerState(clock=clock)
    ledger = Ledger({**stage_limits(DeadlinesConfig(store_s=5, stall_s=300)), **(limits or {})}, clock=clock)
    reporter = RecordingReporter(ledger)
    exits: list[int] = []
    dog = Watchdog(state, ledger, reporter, stall_s=300, exit=exits.append)
    return clock, state, ledger, reporter, exits, dog


def tick(dog: Watchdog) -> None:
    """One pass of the watchdog's loop, without its thread."""
    dog.check()


def test_a_stage_past_its_deadline_fails_its_task_at_once_and_only_it():
    clock, state, ledger, reporter, exits, dog = setup()
    hung, moving = task("hung"), task("moving")
    ledger.hold(hung, Stage.STORE)
    ledger.hold(moving, Stage.GENERATE)
    clock.now += 5
    tick(dog)
    assert reporter.sent == []  # held up to its deadline, inclusive
    clock.now += 0.5
    tick(dog)
    assert reporter.sent == [("hung", "deadline_exceeded", "stage store took longer than 5s (deadlines.store_s)")]
    assert reporter.fates == {"hung": Fate.OVERDUE}  # dropped before it was failed
    assert ledger.dropped(hung) and ledger.fate(moving) is Fate.LIVE
    assert ledger.in_flight() == ["moving"] and exits == []
    tick(dog)
    assert len(reporter.sent) == 1  # failed once


def test_a_task_that_moves_on_gets_its_next_stages_deadline():
    clock, state, ledger, reporter, exits, dog = setup()
    t = task("t")
    ledger.hold(t, Stage.CHECK)  # check_s = 30
    clock.now += 29
    ledger.advance(t, Stage.STORE)
    clock.now += 4
    tick(dog)
    assert reporter.sent == [] and ledger.in_flight() == ["t"]


def test_a_stalled_serve_loop_gives_its_tasks_back_and_exits(caplog):
    clock, state, ledger, reporter, exits, dog = setup({Stage.GENERATE: 400})
    waiting, generating = task("waiting"), task("generating")
    ledger.hold(waiting, Stage.READY)
    ledger.hold(generating, Stage.GENERATE)
    state.progress()
    clock.now += 299
    tick(dog)
    assert exits == []
    clock.now += 2
    ledger.advance(generating, Stage.GENERATE)  # its own deadline is far: the loop's stall decides
    tick(dog)
    assert exits == [STALLED_EXIT]
    assert sorted(reporter.sent) == [("generating", "deadline_exceeded",
                                      "the worker's serve loop stalled in stage generate"),
                                     ("waiting", "released", "")]
    assert reporter.fates == {"waiting": Fate.ABANDONED, "generating": Fate.ABANDONED}
    assert ledger.held() == []
    # Where every thread stood, for the operator: this test's own thread among them.
    said = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "CRITICAL")
    assert "Every thread's stack" in said and "test_a_stalled_serve_loop_gives_its_tasks_back_and_exits" in said
