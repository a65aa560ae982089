"""The scheduler's /metrics, /readyz and Prometheus discovery, against a real server (both backends)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from scheduler.app import create_app
from scheduler.config import ApiConfig
from tests.harness import REG, drain, register


def scrape(http) -> dict[tuple[str, tuple], float]:
    resp = http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def value(got, name, **labels) -> float:
    return got.get((name, tuple(sorted(labels.items()))), 0.0)


def test_queue_depth_leases_and_reports_move_with_the_work(server):
    wid = register(server)
    drain(server, wid)
    before = scrape(server)
    for priority in (0, 0, 5):
        assert server.post("/v1/tasks", json={"input": {"prompt": "x"}, "priority": priority}).status_code == 201
    mid = scrape(server)
    assert value(mid, "dit_scheduler_queue_depth", priority="0") == 2
    assert value(mid, "dit_scheduler_queue_depth", priority="5") == 1
    assert value(mid, "dit_scheduler_oldest_queued_age_seconds") >= 0
    assert value(mid, "dit_scheduler_submissions_total", result="created") - \
        value(before, "dit_scheduler_submissions_total", result="created") == 3
    leases = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 3}).json()["leases"]
    ok, bad, stale = leases
    for lease, status in ((ok, "succeeded"), (bad, "failed")):
        body = {"worker_id": wid, "lease_token": lease["lease_token"], "status": status}
        if status == "succeeded":
            body["result"] = {"uri": "file:///x.png", "content_type": "image/png", "width": 64, "height": 64,
                              "seed": 1, "bytes": 1, "sha256": "0"}
        else:
            body["error"] = {"code": "unsafe_prompt", "message": "no", "retryable": False}
        assert server.post(f"/v1/tasks/{lease['task_id']}/report", json=body).status_code == 200
    refused = server.post(f"/v1/tasks/{stale['task_id']}/report", json={
        "worker_id": wid, "lease_token": "not-the-token", "status": "processing"})
    assert refused.status_code == 409
    assert server.post(f"/v1/tasks/{stale['task_id']}/report", json={
        "worker_id": wid, "lease_token": stale["lease_token"], "status": "released"}).status_code == 200
    after = scrape(server)

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("dit_scheduler_leases_granted_total") == 3
    assert moved("dit_scheduler_reports_total", status="succeeded", outcome="accepted") == 1
    assert moved("dit_scheduler_reports_total", status="failed", outcome="accepted") == 1
    assert moved("dit_scheduler_reports_total", status="processing", outcome="conflict") == 1
    assert moved("dit_scheduler_reports_total", status="released", outcome="accepted") == 1
    assert value(after, "dit_scheduler_queued") == 1 and value(after, "dit_scheduler_running") == 0
    assert value(after, "dit_scheduler_workers", status="initializing") >= 1
    assert moved("dit_scheduler_request_seconds_count", method="POST", route="/v1/tasks/{task_id}/report",
                 code="409") == 1
    assert moved("dit_scheduler_request_seconds_count", method="POST", route="/v1/workers/{worker_id}/lease",
                 code="200") == 1


def test_expired_leases_are_counted_as_reclaimed(server):
    wid = register(server)
    drain(server, wid)
    before = scrape(server)
    assert value(before, "dit_scheduler_running") == 0
    server.post("/v1/tasks", json={"input": {"prompt": "x"}})
    assert server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).status_code == 200
    # The server's lease TTL is 1 s; the sweep runs every second. Wait on the event, not a sleep.
    resp = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 10})
    assert resp.status_code == 200  # the expired task came back
    after = scrape(server)
    key = ("dit_scheduler_leases_reclaimed_total", (("reason", "lease_expired"), ("result", "queued")))
    assert after.get(key, 0) - before.get(key, 0) == 1


def test_ready_when_the_database_answers(server):
    assert server.get("/readyz").json() == {"ok": True, "reason": "database reachable"}
    assert server.get("/livez").status_code == 200


def test_prometheus_discovers_workers_that_registered_an_ops_url(server):
    with_url = {**REG, "hostname": "gpu-node-7", "ops_url": "http://gpu-node-7:9400"}
    wid = server.post("/v1/workers", json=with_url).json()["worker_id"]
    register(server)  # without an endpoint: not a target
    targets = server.get("/v1/workers/targets").json()
    mine = [t for t in targets if t["labels"]["worker_id"] == wid]
    assert mine == [{"targets": ["gpu-node-7:9400"], "labels": {
        "worker_id": wid, "hostname": "gpu-node-7", "node_id": "", "__scheme__": "http"}}]
    assert all(t["targets"] for t in targets)
    assert server.post("/v1/workers", json={**REG, "ops_url": "gopher://x"}).status_code == 422


def test_a_drained_worker_is_counted_drained_never_lost_and_is_no_longer_a_target(make_store, clock):
    store = make_store(liveness_s=5.0)
    with TestClient(create_app(store, ApiConfig(sweep_interval_s=3600))) as http:
        left, _ = (http.post("/v1/workers", json={**REG, "ops_url": f"http://{h}:9400"}).json()["worker_id"]
                         for h in ("left", "crashed"))
        assert http.post(f"/v1/workers/{left}/heartbeat", json={"status": "drained", "timestamp": 0}).status_code == 200
        clock.now += 6  # past the liveness time for both
        store.upkeep.sweep()
        got = scrape(http)
        assert value(got, "dit_scheduler_workers", status="drained") == 1
        assert value(got, "dit_scheduler_workers", status="lost") == 1  # the one that went silent
        assert http.get("/v1/workers/targets").json() == []
        assert http.post(f"/v1/workers/{left}/lease", json={"max_tasks": 1}).status_code == 404
