"""The ledger: every legal change of fate is made by the call that should make it, attempts are held
by identity, an overdue stage is returned once, and the typed counters keep their wire names."""

from __future__ import annotations

import pytest

from protocol import ErrorCode, Lease
from worker.config import DeadlinesConfig
from worker.serving.ledger import (DROPPED, RENEWED, TRANSITIONS, Counter, Fate, IllegalTransition, Ledger,
                                   Stage, Tally, stage_limits)
from worker.serving.task import Task


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def task(task_id: str = "t", attempt: int = 1) -> Task:
    return Task(Lease(task_id=task_id, input={}, created_at=0.0, lease_token=f"tok-{attempt}", lease_deadline=0.0,
                      lease_ttl_s=10.0, attempt=attempt))


def ledger() -> tuple[Ledger, Clock]:
    clock = Clock()
    return Ledger(stage_limits(DeadlinesConfig()), clock=clock), clock


# How each fate is reached from the one before, by the call that makes it in the worker.
def cancel(led: Ledger, clock: Clock, t: Task) -> None:
    led.mark_cancelled([t.id])  # the heartbeat's reply


def lose(led: Ledger, clock: Clock, t: Task) -> None:
    led.mark_lost([t.id])  # the heartbeat's reply


def supersede(led: Ledger, clock: Clock, t: Task) -> None:
    led.hold(task(t.id, t.lease.attempt + 1))  # a later lease of the same task


def expire(led: Ledger, clock: Clock, t: Task) -> None:
    clock.now += 1000  # past every stage's deadline
    led.overdue()  # the watchdog's sweep


def abandon(led: Ledger, clock: Clock, t: Task) -> None:
    led.abandon_all()  # the watchdog, on a stalled serve loop


def end(led: Ledger, clock: Clock, t: Task) -> None:
    led.end(t)  # the reporter, once reported or dropped


CALLS = {Fate.CANCELLED: cancel, Fate.LOST: lose, Fate.OVERDUE: expire, Fate.ABANDONED: abandon, Fate.DONE: end}
# A cancelled task keeps its fate when its lease is lost: only a newer attempt takes the task from it.
SPECIAL = {(Fate.CANCELLED, Fate.LOST): supersede}
PATHS = {Fate.LIVE: [], Fate.CANCELLED: [cancel], Fate.LOST: [lose], Fate.OVERDUE: [expire],
         Fate.ABANDONED: [abandon], Fate.DONE: [end]}


def in_fate(fate: Fate) -> tuple[Ledger, Clock, Task]:
    led, clock = ledger()
    t = task()
    led.hold(t, Stage.GENERATE)
    for step in PATHS[fate]:
        step(led, clock, t)
    assert led.fate(t) is fate
    return led, clock, t


# In Fate's order, not the sets' (hash) order: pytest-xdist's workers must collect the same list.
LEGAL = [(was, to) for was in Fate for to in Fate if to in TRANSITIONS[was]]
ILLEGAL = [(was, to) for was in Fate for to in Fate if to not in TRANSITIONS[was]]


def test_every_fate_has_its_transitions_and_every_path_ends_done():
    assert set(TRANSITIONS) == set(Fate) and TRANSITIONS[Fate.DONE] == frozenset()
    for fate in Fate:
        seen, todo = set(), [fate]
        while todo:
            seen.add(f := todo.pop())
            todo += [t for t in TRANSITIONS[f] if t not in seen]
        assert Fate.DONE in seen, fate
    assert all(Fate.LIVE not in tos for tos in TRANSITIONS.values())  # held LIVE once, never again


@pytest.mark.parametrize("was, to", LEGAL, ids=[f"{a.value}->{b.value}" for a, b in LEGAL])
def test_each_legal_transition_is_made_by_its_call(was, to):
    led, clock, t = in_fate(was)
    SPECIAL.get((was, to), CALLS[to])(led, clock, t)
    assert led.fate(t) is to


@pytest.mark.parametrize("was, to", ILLEGAL, ids=[f"{a.value}->{b.value}" for a, b in ILLEGAL])
def test_an_illegal_transition_raises_and_changes_nothing(was, to):
    led, _, t = in_fate(was)
    held = led._attempts[t]  # the one place a fate is assigned, asked directly
    with pytest.raises(IllegalTransition, match=f"{was.value} -> {to.value} is not a transition"):
        led._move(held, to)
    assert led.fate(t) is was


@pytest.mark.parametrize("was", list(Fate))
def test_an_attempt_is_held_once(was):
    led, _, t = in_fate(was)
    with pytest.raises(IllegalTransition, match="-> live is not a transition"):
        led.hold(t)
    assert led.fate(t) is was


@pytest.mark.parametrize("was", list(Fate))
def test_what_each_fate_means_to_the_others(was):
    led, _, t = in_fate(was)
    assert led.dropped(t) == (was in DROPPED)
    assert led.cancelled(t) == (was is Fate.CANCELLED)
    assert (led.in_flight() == ["t"]) == (was in RENEWED)
    assert ([h.task for h in led.held()] == [t]) == (was is not Fate.DONE)


def test_a_later_attempt_of_a_task_is_a_new_hold_the_earlier_cannot_end():
    led, clock = ledger()
    first, second = task("t", 1), task("t", 2)
    led.hold(first, Stage.STORE)
    led.hold(second, Stage.ADMIT)
    assert led.fate(first) is Fate.LOST and led.dropped(first) and led.fate(second) is Fate.LIVE
    clock.now += 29
    led.advance(first, Stage.REPORT)  # the earlier attempt's late calls...
    led.end(first)
    assert [h.task for h in led.held()] == [second] and led.fate(first) is Fate.DONE
    clock.now += 2
    assert led.in_flight() == [] and [h.task for h in led.overdue()] == [second]  # ...moved nothing of it
    assert led.counters.get(Counter.LEASES_LOST) == 0  # the scheduler said nothing: not counted


def test_notices_go_to_the_attempt_held_and_are_counted_once():
    led, _ = ledger()
    first, second = task("t", 1), task("t", 2)
    led.hold(first)
    led.hold(second)
    assert led.mark_cancelled(["t", "unknown"]) == ["t"] and led.mark_cancelled(["t"]) == []
    assert led.cancelled(second) and not led.cancelled(first)
    led.mark_lost(["t", "t"])
    led.mark_lost(["t"])
    assert led.fate(second) is Fate.CANCELLED  # the cancellation outranks the lost lease...
    assert led.counters.get(Counter.LEASES_LOST) == 1  # ...which is counted, once


def test_an_overdue_stage_is_returned_once_and_no_longer_renewed():
    led, clock = ledger()
    late, moving = task("late"), task("moving")
    led.hold(late, Stage.STORE)  # store_s = 90
    led.hold(moving, Stage.GENERATE)  # generate_s = 120
    clock.now += 90
    assert led.overdue() == [] and led.in_flight() == ["late", "moving"]  # up to the deadline, inclusive
    clock.now += 1
    [held] = led.overdue()
    assert (held.task, held.stage, held.limit_s, held.fate) == (late, Stage.STORE, 90, Fate.OVERDUE)
    assert led.overdue() == [] and led.in_flight() == ["moving"]
    led.advance(late, Stage.REPORT)  # it no longer moves: no new deadline
    assert led.in_flight() == ["moving"]


def test_a_stall_abandons_every_attempt_held_once():
    led, clock = ledger()
    tasks = [task(i) for i in "abc"]
    for t in tasks:
        led.hold(t, Stage.READY)
    led.mark_cancelled(["b"])
    led.end(tasks[2])
    assert [h.task for h in led.abandon_all()] == tasks[:2]
    assert led.abandon_all() == [] and led.in_flight() == []
    assert [led.fate(t) for t in tasks] == [Fate.ABANDONED, Fate.ABANDONED, Fate.DONE]


def test_an_attempt_never_held_is_unknown_and_its_calls_change_nothing():
    led, _ = ledger()
    stray = task("t")
    led.advance(stray, Stage.STORE)
    led.end(stray)
    assert led.fate(stray) is None and not led.dropped(stray) and led.held() == []


def test_each_stage_has_its_deadline_field():
    fields = {stage: stage.field for stage in Stage}
    assert fields == {Stage.ADMIT: "admit_s", Stage.FETCH: "fetch_s", Stage.READY: "stall_s", Stage.SWAP: "swap_s",
                      Stage.GENERATE: "generate_s", Stage.CHECK: "check_s", Stage.ENCODE: "encode_s", Stage.STORE: "store_s",
                      Stage.REPORT: "report_s"}
    assert set(fields.values()) == set(DeadlinesConfig.model_fields)
    assert stage_limits(DeadlinesConfig(store_s=7))[Stage.STORE] == 7
    # Waiting for its adapters' download or its model's swap is not started either: given back, the
    # attempt does not count.
    assert [s for s in Stage if not s.started] == [Stage.ADMIT, Stage.FETCH, Stage.READY, Stage.SWAP]


def test_counters_have_the_wire_names_they_always_had():
    assert {c.value for c in Counter} == {
        "images_generated", "corrupt_outputs", "prompts_refused", "images_refused", "tasks_succeeded",
        "tasks_failed", "tasks_released", "tasks_cancelled", "leases_lost", "heartbeat_failures", "reports",
        "report_us_total", "lease_ahead", "max_pending", "peak_memory_mb", "unreported_max", "swaps"}
    tally = Tally()
    assert tally.as_wire() == {}
    tally.add(Counter.IMAGES_GENERATED, 0)  # listed once touched, even by 0
    tally.add(Counter.TASKS_SUCCEEDED, 2)
    tally.add(Counter.TASKS_SUCCEEDED)
    tally.set(Counter.LEASE_AHEAD, 8)
    tally.set(Counter.LEASE_AHEAD, 4)
    tally.high_water(Counter.UNREPORTED_MAX, 5)
    tally.high_water(Counter.UNREPORTED_MAX, 3)
    tally.failed(ErrorCode.STORAGE_UNAVAILABLE)
    tally.failed("storage_unavailable")  # as an ErrorEnvelope carries it
    assert tally.as_wire() == {"images_generated": 0, "tasks_succeeded": 3, "lease_ahead": 4, "unreported_max": 5,
                               "failed.storage_unavailable": 2}
    assert tally.failures() == {ErrorCode.STORAGE_UNAVAILABLE: 2} and tally.get(Counter.REPORTS) == 0


def test_a_counter_is_never_named_by_a_string():
    tally = Tally()
    with pytest.raises(TypeError):
        tally.add("tasks_succeeded")
    with pytest.raises(ValueError):
        tally.failed("no_such_code")
    assert tally.as_wire() == {}
