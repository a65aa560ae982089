"""The scheduler benchmark's smoke run: a few simulated workers against a real SQLite scheduler, one
report per call and batched, every task completed and counted once; and its steady window."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.scheduler import Window, run_backend

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.mark.parametrize("lease_max", [1, 8])
def test_the_bench_completes_every_task_and_reports_its_figures(tmp_path, lease_max):
    args = argparse.Namespace(workers=5, tasks=40, lease_max=lease_max, work_s=0.01, heartbeat_s=0.05)
    row = run_backend("sqlite", args, tmp_path, pg=None)
    assert row["tasks"] == 40 and row["lifecycles_per_s"] > 0 and row["leases"] >= 1
    assert 0 < row["lease_p50_ms"] <= row["lease_p99_ms"]
    assert row["heartbeats"] > 0 and row["heartbeats_refused"] == 0
    json.dumps(row)


def test_the_window_leaves_out_the_start_and_the_drain():
    window = Window(tasks=100, procs={})
    leases = [(t / 10, 1000.0 if t < 10 else 5.0, 1) for t in range(100)]  # a slow start burst
    done_at = []
    for n in range(1, 101):
        done_at.append(n / 10)
        if n == 80:
            window.queue_ran_dry(n / 10)  # from here the queue is short: the drain
        window.completed(n, done_at[-1])
    row = window.figures(done_at, leases)
    assert row["steady"] and window.start == 1.0 and window.end == 8.0
    assert row["lifecycles_per_s"] == pytest.approx(10.0, rel=0.02)
    assert row["lease_p99_ms"] == 5.0  # the start burst's 1000 ms leases are not in it
    assert set(row["cores"]) == {"bench client", "others (database)"}
