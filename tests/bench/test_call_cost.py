"""`make bench-calls`: the scheduler's CPU per call, its arithmetic, and a short run of one
scheduler against another with a setting changed, side by side."""

from __future__ import annotations

import json

import pytest

from bench import calls as call_cost

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def blocks(submit, lease, processing, succeeded, heartbeat=(1.0,), exchange=(1.0,)):
    return {"submit": list(submit), "lease": list(lease), "processing": list(processing),
            "succeeded": list(succeeded), "heartbeat": list(heartbeat) * len(submit),
            "exchange": list(exchange) * len(submit) if len(exchange) == 1 else list(exchange)}


def test_a_task_is_the_median_over_blocks_of_its_four_calls_summed_block_by_block():
    per = blocks(submit=[100, 300, 200], lease=[100, 100, 100], processing=[50, 50, 50], succeeded=[50, 50, 50])
    fig = call_cost.summary(per)
    assert fig["submit"] == 200 and fig["lease"] == 100
    assert fig["task"] == 400  # blocks: 300, 500, 400


def test_a_task_by_the_exchange_is_its_submit_and_one_exchange():
    per = blocks(submit=[100, 300, 200], lease=[100] * 3, processing=[50] * 3, succeeded=[50] * 3,
                 exchange=[150, 150, 100])
    assert call_cost.summary(per)["task_exchange"] == 300  # blocks: 250, 450, 300


def test_ratios_are_taken_block_by_block_then_their_median():
    this = blocks(submit=[100, 100, 100], lease=[100] * 3, processing=[100] * 3, succeeded=[100] * 3)
    against = blocks(submit=[200, 100, 50], lease=[100] * 3, processing=[100] * 3, succeeded=[100] * 3)
    r = call_cost.ratios(this, against)
    assert r["submit"] == 1.0  # 0.5, 1, 2
    assert r["task"] == pytest.approx(1.0)
    assert r["lease"] == 1.0


def test_a_short_run_measures_each_call_on_both_schedulers(tmp_path, capsys):
    out = tmp_path / "calls.json"
    assert call_cost.main(["--calls", "20", "--blocks", "2", "--against-set", "api.hot_path=false",
                           "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    for side in ("this", "against"):
        assert set(report["blocks_us"][side]) == set(call_cost.KINDS)
        assert all(len(v) == 2 and all(us > 0 for us in v) for v in report["blocks_us"][side].values())
        assert report[side]["task"] > 0
    assert set(report["ratios"]) == {*call_cost.KINDS, "task", "task_exchange"}
    assert "this / against" in capsys.readouterr().out
