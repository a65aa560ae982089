"""Rank 0's models when a worker serves several (worker.serving.swapping): what the scheduler is
told, and which resident models a swap evicts: a priority-weighted LRU under the memory budget."""

from __future__ import annotations

from protocol import WorkerModels
from tests.harness import Clock
from worker.config import ModelConfig
from worker.serving.state import WorkerState
from worker.serving.swapping import Models


def catalog(**priorities: float) -> dict[str, ModelConfig]:
    return {name: ModelConfig(name=name, priority=p, memory_mb=100) for name, p in priorities.items()}


def models(budget_mb: int, **priorities: float) -> tuple[Models, WorkerState, Clock]:
    clock, state = Clock(), WorkerState()
    return Models(catalog(**priorities), budget_mb, state, clock), state, clock


def test_it_says_what_it_holds_and_can_load_as_soon_as_that_changes():
    m, state, _ = models(0, a=1, b=1)
    assert state.models == WorkerModels(resident=[], loadable=["a", "b"])  # registering: loading a
    state.changed.clear()
    m.loaded("a", (), 100)
    assert state.models == WorkerModels(resident=["a"], loadable=["b"]) and state.changed.is_set()


def test_without_a_budget_it_holds_one_model_at_a_time():
    m, _, _ = models(0, a=1, b=1)
    m.loaded("a", (), 100)
    assert m.victims("b") == ("a",)


def test_under_a_budget_the_model_idle_longest_for_its_priority_goes_first():
    m, _, clock = models(250, a=1, b=3, c=1)
    m.loaded("a", (), 100)
    clock.now += 10
    m.loaded("b", (), 100)
    clock.now += 10  # a idle 20 s at priority 1 (20), b idle 10 s at priority 3 (3.3): a goes
    assert m.victims("c") == ("a",)
    m.used("a")
    clock.now += 1  # a idle 1 s, b 11 s at priority 3 (3.7): b goes
    assert m.victims("c") == ("b",)


def test_room_enough_evicts_nothing_and_an_unknown_size_takes_the_whole_budget():
    m, _, _ = models(300, a=1, b=1)
    m.loaded("a", (), 100)
    assert m.victims("b") == ()
    unsized = Models({"a": ModelConfig(name="a"), "b": ModelConfig(name="b")}, 300, WorkerState())
    unsized.loaded("a", (), 0)
    assert unsized.victims("b") == ("a",)


def test_while_a_swap_loads_it_says_it_holds_the_model_it_loads():
    m, state, _ = models(0, a=1, b=1)
    m.loaded("a", (), 100)
    m.loading("b", ("a",))  # leases made meanwhile say b, as the scheduler marked it
    assert state.models == WorkerModels(resident=["b"], loadable=["a"])


def test_a_model_that_failed_to_load_is_refused_and_no_longer_offered():
    m, state, _ = models(0, a=1, b=1)
    m.loaded("a", (), 100)
    m.loading("b", ("a",))
    m.failed("b", ("a",), "rank 1: OSError: no such directory")
    assert state.models == WorkerModels(resident=[], loadable=["a"])
    assert "failed to load on this worker: rank 1: OSError" in m.refusal("b")
    assert "does not serve model 'z'" in m.refusal("z") and m.refusal("a") is None


def test_a_swap_is_not_a_stalled_serve_loop_until_its_grace_ends():
    clock = Clock()
    state = WorkerState(clock=clock)
    state.grant(900)
    clock.now += 600
    assert state.idle_s() == 0
    clock.now += 301
    assert state.idle_s() == 1
