"""End to end: Prometheus scrapes of the scheduler's and a 2-rank worker's /metrics while tasks
succeed and fail, health probes, and the exposition as Prometheus's own parser reads it."""

from __future__ import annotations

import subprocess

import httpx
from prometheus_client.parser import text_string_to_metric_families
import pytest

from launch.local import wait_until
from tests.harness import Prometheus, Stack, ready_worker, settled_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    resp = httpx.get(f"{url}/metrics", timeout=10)
    assert resp.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def at(got, name, **labels) -> float:
    return got.get((name, tuple(sorted(labels.items()))), 0.0)


def test_both_metrics_endpoints_move_as_tasks_succeed_and_fail(tmp_path, tiny_model):
    stack = Stack(tmp_path, tiny_model)
    try:
        inputs = [({"prompt": "a lighthouse", "width": 256, "height": 256}, 0),
                  ({"prompt": "a harbour", "width": 256, "height": 128}, 0),
                  ({"prompt": "x", "width": 100}, 0),  # invalid_request
                  ({"prompt": "you are a fucking idiot"}, 7)]  # unsafe_prompt (profanity check)
        ids = [stack.client.submit(i, priority=p)["id"] for i, p in inputs]
        queued = scrape(stack.url)  # no worker yet: the queue holds them all
        assert at(queued, "dit_scheduler_queue_depth", priority="0") == 3
        assert at(queued, "dit_scheduler_queue_depth", priority="7") == 1
        assert at(queued, "dit_scheduler_oldest_queued_age_seconds") > 0

        stack.proc = stack.worker(nproc=2, overrides=["safety.text.backend=profanity"])  # the insult below
        # The worker registers (with its ops address) before it loads the model and warms up: not
        # ready until then, alive all along.
        ops = wait_until(lambda: next((w["ops_url"] for w in stack.registered()), None), 120, "a registration",
                         stack.proc)
        assert ops.startswith("http://127.0.0.1:")
        seen = []

        def probe():
            ready = httpx.get(f"{ops}/readyz", timeout=5)
            seen.append((ready.status_code, ready.json()["reason"]))
            assert httpx.get(f"{ops}/livez", timeout=5).status_code == 200
            return ready.status_code == 200

        wait_until(probe, 120, "readiness", stack.proc, every_s=0.05)
        assert seen[0] == (503, "loading and warming up") and seen[-1] == (200, "ready"), seen
        worker = ready_worker(stack, stack.proc)
        assert httpx.get(f"{ops}/livez", timeout=5).status_code == 200
        tasks = stack.client.wait(ids, 120, proc=stack.proc)
        assert [tasks[i]["status"] for i in ids] == ["succeeded", "succeeded", "failed", "failed"]

        after = scrape(stack.url)
        assert at(after, "dit_scheduler_queued") == 0 and at(after, "dit_scheduler_running") == 0
        assert at(after, "dit_scheduler_leases_granted_total") == 4
        assert at(after, "dit_scheduler_reports_total", status="succeeded", outcome="accepted") == 2
        assert at(after, "dit_scheduler_reports_total", status="failed", outcome="accepted") == 2
        assert at(after, "dit_scheduler_workers", status="ready") == 1
        # The worker's calls (queue.exchange, the default): leases and reports in exchanges.
        assert at(after, "dit_scheduler_request_seconds_count", method="POST",
                  route="/v1/workers/{worker_id}/exchange", code="200") >= 1

        view = settled_worker(stack)  # its counters after a heartbeat that follows every report
        w = scrape(ops)
        assert at(w, "dit_worker_tasks_total", outcome="succeeded") == view["counters"]["tasks_succeeded"] == 2
        assert at(w, "dit_worker_tasks_total", outcome="failed") == view["counters"]["tasks_failed"] == 2
        assert at(w, "dit_worker_task_failures_total", code="invalid_request") == 1
        assert at(w, "dit_worker_task_failures_total", code="unsafe_prompt") == 1
        assert at(w, "dit_worker_refusals_total", check="text") == 1
        assert at(w, "dit_worker_images_generated_total") == view["counters"]["images_generated"] == 2
        for stage in ("lease", "broadcast", "embed", "denoise", "vae", "gather", "image_check", "encode", "store",
                      "report"):
            assert at(w, "dit_worker_stage_seconds_count", stage=stage) >= 2, stage
        assert at(w, "dit_worker_stage_seconds_count", stage="text_check") == 3  # the invalid one never got there
        assert at(w, "dit_worker_batch_size_count") >= 1
        assert at(w, "dit_worker_status", status="ready") == 1
        assert at(w, "dit_worker_in_flight") == 0

        targets = stack.client.http.get("/v1/workers/targets").json()
        assert [t["targets"] for t in targets] == [[ops.removeprefix("http://")]]
        for url in (stack.url, ops):  # Prometheus's own linter on both expositions
            lint = subprocess.run(["promtool", "check", "metrics"], input=httpx.get(f"{url}/metrics").text,
                                  capture_output=True, text=True, timeout=30)
            assert lint.returncode == 0, f"{url}: {lint.stdout}{lint.stderr}"

        # A real Prometheus finds the worker through the scheduler and scrapes both.
        prom = Prometheus(tmp_path, stack.url)
        try:
            up = wait_until(lambda: {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
                            if len(prom.query("up == 1")) == 2 else None, 60, "Prometheus scraping both")
            assert up == {"dit-scheduler": "1", "dit-worker": "1"}
            (done,) = prom.query('dit_worker_tasks_total{outcome="succeeded"}')
            assert done["value"][1] == "2" and done["metric"]["worker_id"] == worker["id"]
        finally:
            prom.stop()
    finally:
        stack.close()
