"""make bench-models: one seeded schedule for both routes, and its figures' arithmetic; a short run
against real schedulers shows affinity routing swapping less than FIFO."""

from __future__ import annotations

import json

import pytest

from bench.models import Plan, Run, figures, main

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

PLAN = Plan(models=["a", "b"], mix=[0.75, 0.25], workers=2, work_s=0.5, swap_s=1.0, rate=4.0, seconds=30.0, seed=3)


def test_both_routes_get_the_same_schedule_with_the_mix_asked_for():
    first, again = PLAN.schedule(), PLAN.schedule()
    assert first == again and all(0 < t < 30 for t, _ in first)
    share_a = sum(m == "a" for _, m in first) / len(first)
    assert 100 < len(first) < 140 and 0.6 < share_a < 0.9


def test_figures_count_swaps_per_hundred_tasks_and_the_wait_percentiles():
    run = Run(waits={"a": [0.1] * 9 + [2.0], "b": [1.0]}, done=11, swaps=2, swap_s=2.0, busy_s=6.0)
    row = figures(run, PLAN)
    assert row["swaps_per_100_tasks"] == 18.2 and row["wait_p50_s"] == 0.1 and row["swapping_share"] == 0.25
    assert row["wait_p95_s_by_model"] == {"a": 1.15, "b": 1.0}


def test_a_short_run_swaps_less_with_affinity_than_with_fifo(tmp_path):
    out = tmp_path / "models.json"
    assert main(["--seconds", "6", "--swap-s", "1", "--work-s", "0.2", "--out", str(out)]) == 0
    routes = json.loads(out.read_text())["routes"]
    assert routes["affinity"]["completed"] == routes["affinity"]["offered"]
    assert routes["affinity"]["swaps_per_100_tasks"] < routes["fifo"]["swaps_per_100_tasks"]


def test_with_adapter_sets_the_schedule_draws_a_set_per_task_by_a_zipf_law():
    plan = Plan(models=["a"], mix=[1.0], workers=2, work_s=0.5, swap_s=1.0, rate=8.0, seconds=30.0, seed=3, sets=6)
    drawn = [what for _, what in plan.schedule()]
    assert all(what.startswith("a/set-") for what in drawn)
    counts = [drawn.count(f"a/set-{k}") for k in range(6)]
    assert counts[0] == max(counts) and counts[0] > 2 * counts[5]
