"""The routing decision on a fleet of several models (scheduler/store/routing.py), on its own: which
model a worker's next lease is of."""

from __future__ import annotations

from scheduler.store.routing import changes, pick

NOW, COLD = 1000.0, 10.0


def head(model: str, seq: int, waited: float = 0.0, priority: int = 0) -> dict:
    return {"model": model, "priority": priority, "seq": seq, "created_at": NOW - waited}


def test_its_own_model_first_however_old_the_others_are_while_they_have_a_warm_worker():
    heads = [head("b", 1, waited=5), head("a", 2)]
    assert pick(heads, {"a": True, "b": False}, {"a": (1, 0.0), "b": (1, 0.0)}, NOW, COLD) == "a"


def test_a_model_nobody_holds_is_loaded_by_a_worker_with_nothing_of_its_own_to_do():
    mine = {"a": True, "b": False}
    assert pick([head("b", 1)], mine, {"a": (1, 0.0)}, NOW, COLD) == "b"
    assert pick([head("b", 1), head("a", 2)], mine, {"a": (1, 0.0)}, NOW, COLD) == "a"  # its own first


def test_a_model_another_worker_holds_is_left_to_it_until_its_task_waited_cold_wait():
    mine, holders = {"a": True, "b": False}, {"b": (1, 0.0)}
    assert pick([head("b", 1, waited=COLD - 1)], mine, holders, NOW, COLD) is None
    assert pick([head("b", 1, waited=COLD), head("a", 2)], mine, holders, NOW, COLD) == "b"  # overdue: before its own


def test_an_overdue_model_pulls_in_one_more_worker_per_cold_wait_not_a_herd():
    mine = {"a": True, "b": False}
    gained_just_now = {"b": (1, NOW - 1)}
    assert pick([head("b", 1, waited=3 * COLD), head("a", 2)], mine, gained_just_now, NOW, COLD) == "a"
    assert pick([head("b", 1, waited=3 * COLD)], mine, gained_just_now, NOW, COLD) is None


def test_within_a_class_higher_priority_then_older():
    mine = {"a": True, "b": True}
    assert pick([head("a", 2), head("b", 1)], mine, {}, NOW, COLD) == "b"
    assert pick([head("a", 2, priority=5), head("b", 1)], mine, {}, NOW, COLD) == "a"


def test_fifo_takes_the_first_task_of_any_model_it_serves():
    heads = [head("a", 2), head("b", 1)]
    assert pick(heads, {"a": True, "b": False}, {"b": (3, NOW)}, NOW, COLD, route="fifo") == "b"


def test_no_task_no_model():
    assert pick([], {"a": True}, {}, NOW, COLD) is None


def test_what_a_lease_says_it_holds_changes_only_what_differs():
    assert changes({"a": True, "b": False}, ["a"]) == {}
    assert changes({"a": True, "b": False}, ["b"]) == {"b": True, "a": False}
    assert changes({"a": True}, ["c"]) == {"c": True, "a": False}  # a model it had not listed: held now
