"""The scheduler benchmark's smoke run: a few simulated workers against a real SQLite scheduler, one
report per call and batched, every task completed and counted once."""

from __future__ import annotations

import argparse
import json

import pytest

from tools.scheduler_bench import run_backend


@pytest.mark.parametrize("lease_max", [1, 8])
def test_the_bench_completes_every_task_and_reports_its_figures(tmp_path, lease_max):
    args = argparse.Namespace(workers=5, tasks=40, lease_max=lease_max, work_s=0.01)
    row = run_backend("sqlite", args, tmp_path, pg=None)
    assert row["tasks"] == 40 and row["lifecycles_per_s"] > 0 and row["leases"] >= 40 // lease_max
    assert 0 < row["lease_p50_ms"] <= row["lease_p99_ms"]
    json.dumps(row)
