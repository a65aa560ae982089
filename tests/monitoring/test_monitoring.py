"""The monitoring files in monitoring/: Prometheus's own promtool checks the alert rules and the
scrape config and runs the rules' unit tests; the Grafana dashboard is its generator's output; and
every metric the rules and the dashboard query is one the worker or the scheduler exposes."""

from __future__ import annotations

import json
import re
import types
import shutil
import subprocess

import pytest
import torch
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from launch.local import REPO
from protocol import DeviceInfo, ErrorCode
from scheduler.metrics import SchedulerMetrics
from scheduler.store import SQLiteStore
from tests.worker.serving.test_metrics import FakeNvml
from release import grafana_dashboard
from worker.serving.ledger import Ledger
from worker.serving.metrics import Metrics
from worker.serving.state import WorkerState

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

PROM = REPO / "monitoring" / "prometheus"
DASHBOARD = REPO / "monitoring" / "grafana" / "dit-fleet.json"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: `make install` installs Debian's prometheus package")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=PROM)


def test_promtool_accepts_the_rules_and_the_config_and_the_rules_fire_as_their_tests_say():
    for args in (("check", "rules", "alerts.yml"), ("check", "config", "prometheus.yml"),
                 ("test", "rules", "alerts.test.yml")):
        out = promtool(*args)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}\n{out.stderr}"


def test_the_dashboard_is_its_generators_output():
    assert DASHBOARD.read_text() == grafana_dashboard.render(), "run python -m release.grafana_dashboard"
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)


class Nvml(FakeNvml):
    def nvmlDeviceGetMemoryInfo(self, h):  # the fake worker test's board refuses this reading
        return types.SimpleNamespace(used=1 << 30)


def exposed_names(tmp_path, monkeypatch) -> set[str]:
    """Every sample name the worker's rank 0 and the scheduler expose, with GPU and device memory."""
    for fn in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, fn, lambda device=None: 1 << 30)
    state, ledger = WorkerState(warnings=["a check is off"]), Ledger()
    worker = Metrics(state, ledger, torch.device("cuda", 0))
    worker.watch_gpus([DeviceInfo(name="H100", memory_bytes=1, uuid="aaaa")], nvml=Nvml())
    ledger.counters.failed(ErrorCode.STORAGE_UNAVAILABLE)
    worker.task_reported({"denoise": 10.0})
    worker.round_generated([1])
    sched = SchedulerMetrics(SQLiteStore(tmp_path / "s.db"))
    sched.submissions.labels("created").inc()
    sched.reports.labels("succeeded", "accepted").inc()
    sched.requests.labels("GET", "/v1/tasks", "200").observe(0.01)
    text = generate_latest(worker.registry).decode() + sched.exposition().decode()
    names = set()
    for family in text_string_to_metric_families(text):  # a family without samples yet still counts
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + suffix for suffix in suffixes} | {s.name for s in family.samples}
    return names


def queried_names() -> dict[str, set[str]]:
    exprs = {"dashboard": [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])],
             "alerts": [r["expr"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
                        for r in g["rules"]]}
    return {where: {n for e in found for n in re.findall(r"\b(dit_[a-z_]+)", e)} for where, found in exprs.items()}


def test_every_metric_the_rules_and_the_dashboard_query_is_exposed(tmp_path, monkeypatch):
    exposed = exposed_names(tmp_path, monkeypatch)
    queried = queried_names()
    assert len(queried["dashboard"]) > 15 and len(queried["alerts"]) >= 7
    for where, names in queried.items():
        assert names - exposed == set(), f"{where} queries metrics nobody exposes"
