"""Writes monitoring/grafana/dit-fleet.json, the Grafana dashboard for a dit-worker fleet, from the
panel list below (`python -m release.grafana_dashboard`). tests/monitoring checks that the committed
file is this output and that every metric it queries exists."""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "monitoring" / "grafana" / "dit-fleet.json"
DS = {"type": "prometheus", "uid": "${datasource}"}

# (title, kind, unit, [(expr, legend)]), in rows; a row's panels share its width.
ROWS: list[tuple[str, list[tuple[str, str, str, list[tuple[str, str]]]]]] = [
    ("Fleet", [
        ("Ready workers", "stat", "none", [('max(dit_scheduler_workers{status="ready"})', "ready")]),
        ("Queued", "stat", "none", [("max(dit_scheduler_queued)", "queued")]),
        ("Oldest queued", "stat", "s", [("max(dit_scheduler_oldest_queued_age_seconds)", "age")]),
        ("Tasks per second", "timeseries", "ops", [
            ("sum by (outcome) (rate(dit_worker_tasks_total[5m]))", "{{outcome}}")]),
    ]),
    ("Queue and tasks", [
        ("Queue depth by priority", "timeseries", "none", [
            ("max by (priority) (dit_scheduler_queue_depth)", "priority {{priority}}")]),
        ("Stage time p95", "timeseries", "s", [
            ("histogram_quantile(0.95, sum by (le, stage) (rate(dit_worker_stage_seconds_bucket[5m])))", "{{stage}}")]),
        ("Failures by code", "timeseries", "ops", [
            ("sum by (code) (rate(dit_worker_task_failures_total[5m]))", "{{code}}")]),
        ("Refusals and lost leases", "timeseries", "ops", [
            ("sum by (check) (rate(dit_worker_refusals_total[5m]))", "refused: {{check}}"),
            ("sum(rate(dit_worker_leases_lost_total[5m]))", "leases lost"),
            ("sum(rate(dit_worker_heartbeat_failures_total[5m]))", "heartbeat failures")]),
    ]),
    ("GPUs", [
        ("GPU temperature", "timeseries", "celsius", [
            ("dit_worker_gpu_temperature_celsius", "{{instance}} rank {{rank}}")]),
        ("GPU power", "timeseries", "watt", [("dit_worker_gpu_power_watts", "{{instance}} rank {{rank}}")]),
        ("SM clock", "timeseries", "hertz", [('dit_worker_gpu_clock_hertz{clock="sm"}', "{{instance}} rank {{rank}}")]),
        ("Clocks held down", "timeseries", "none", [
            ("max by (instance, rank, reason) (dit_worker_gpu_throttled) > 0", "{{reason}} {{instance}} rank {{rank}}")]),
        ("GPU utilisation", "timeseries", "percentunit", [
            ("dit_worker_gpu_utilization_ratio", "{{instance}} rank {{rank}}")]),
        ("GPU memory", "timeseries", "bytes", [
            ("dit_worker_gpu_memory_used_bytes", "used {{instance}} rank {{rank}}"),
            ('dit_worker_device_memory_bytes{kind="reserved"}', "rank 0 reserved {{instance}}")]),
    ]),
    ("Workers and scheduler", [
        ("Batch size (mean)", "timeseries", "none", [
            ("sum(rate(dit_worker_batch_size_sum[5m])) / sum(rate(dit_worker_batch_size_count[5m]))", "mean")]),
        ("Request latency p99 by route", "timeseries", "s", [
            ('histogram_quantile(0.99, sum by (le, route) (rate(dit_scheduler_request_seconds_bucket{route!="/v1/workers/{worker_id}/lease"}[5m])))',
             "{{route}}")]),
        ("Leases granted and reclaimed", "timeseries", "ops", [
            ("sum(rate(dit_scheduler_leases_granted_total[5m]))", "granted"),
            ("sum by (reason) (rate(dit_scheduler_leases_reclaimed_total[5m]))", "reclaimed: {{reason}}")]),
        ("Reports by status", "timeseries", "ops", [
            ("sum by (status, outcome) (rate(dit_scheduler_reports_total[5m]))", "{{status}} {{outcome}}")]),
        ("Webhook calls", "timeseries", "ops", [
            ("sum by (event, outcome) (rate(dit_scheduler_webhooks_total[5m]))", "{{event}} {{outcome}}")]),
    ]),
]


def panel(pid: int, x: int, y: int, w: int, title: str, kind: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    return {"id": pid, "type": kind, "title": title, "datasource": DS,
            "gridPos": {"h": 4 if kind == "stat" else 8, "w": w, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if kind == "timeseries" else
            {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"},
            "targets": [{"refId": chr(65 + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for i, (expr, legend) in enumerate(targets)]}


def dashboard() -> dict:
    panels, pid, y = [], 1, 0
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        w = 24 // len(row)
        for i, spec in enumerate(row):
            panels.append(panel(pid, w * i, y, w, *spec))
            pid += 1
        y += 8
    return {"uid": "dit-fleet", "title": "dit-worker fleet", "tags": ["dit-worker"], "timezone": "browser",
            "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                     "label": "Prometheus"}]},
            "panels": panels}


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
