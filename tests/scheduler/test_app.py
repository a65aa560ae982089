"""The protocol over HTTP, against the scheduler running as a real server on 127.0.0.1."""

from __future__ import annotations

import time

import httpx

from tests.harness import drain, register


def test_submit_get_list(server):
    t = server.post("/v1/tasks", json={"input": {"prompt": "a"}, "priority": 3}).json()
    assert t["status"] == "queued" and t["priority"] == 3 and t["attempts"] == 0
    assert server.get(f"/v1/tasks/{t['id']}").json()["id"] == t["id"]
    ids = [x["id"] for x in server.get("/v1/tasks", params={"status": "queued"}).json()["tasks"]]
    assert t["id"] in ids
    assert server.get("/v1/tasks/nope").status_code == 404


def test_idempotent_submit(server):
    body = {"input": {"prompt": "same"}, "idempotency_key": "k-42"}
    first, again = server.post("/v1/tasks", json=body), server.post("/v1/tasks", json=body)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = server.post("/v1/tasks", json={**body, "input": {"prompt": "different"}})
    assert other.status_code == 409


def test_lease_long_polls_then_204(server):
    wid = register(server)
    drain(server, wid)
    t0 = time.monotonic()
    resp = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 1.0})
    assert resp.status_code == 204 and 0.9 < time.monotonic() - t0 < 5


def test_long_poll_wakes_on_submit(server):
    wid = register(server)
    drain(server, wid)
    import threading

    threading.Timer(0.3, lambda: httpx.post(f"{server.base_url}/v1/tasks",
                                            json={"input": {"prompt": "late"}})).start()
    t0 = time.monotonic()
    resp = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 10.0})
    assert resp.status_code == 200 and time.monotonic() - t0 < 3
    assert resp.json()["leases"][0]["input"] == {"prompt": "late"}


def test_full_lifecycle(server):
    wid = register(server)
    drain(server, wid)
    t = server.post("/v1/tasks", json={"input": {"prompt": "life"}}).json()
    lease = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"][0]
    assert lease["task_id"] == t["id"] and lease["attempt"] == 1
    rep = {"worker_id": wid, "lease_token": lease["lease_token"]}
    assert server.post(f"/v1/tasks/{t['id']}/report", json={**rep, "status": "processing"}).json()[
        "status"] == "processing"
    hb = server.post(f"/v1/workers/{wid}/heartbeat",
                     json={"status": "ready", "in_flight": [t["id"]], "timestamp": time.time()})
    assert t["id"] in hb.json()["renewed"]
    result = {"uri": "file:///x.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 7,
              "bytes": 10, "sha256": "00", "timings_ms": {"generate": 1.0}}
    done = server.post(f"/v1/tasks/{t['id']}/report", json={**rep, "status": "succeeded", "result": result})
    assert done.status_code == 200 and done.json()["result"]["seed"] == 7
    workers = {w["id"]: w for w in server.get("/v1/workers").json()}
    assert workers[wid]["status"] == "ready" and workers[wid]["world_size"] == 2


def test_openapi_is_served(server):
    paths = server.get("/openapi.json").json()["paths"]
    assert {"/v1/tasks", "/v1/workers/{worker_id}/lease", "/v1/tasks/{task_id}/report"} <= set(paths)


def test_a_batch_is_stored_in_one_call_and_the_queue_figures_follow(server):
    wid = register(server)
    drain(server, wid)
    batch = [{"input": {"prompt": f"b{i}"}, "priority": i % 2} for i in range(10)]
    resp = server.post("/v1/tasks/batch", json={"tasks": batch + [{"input": {"prompt": "k"}, "idempotency_key": "kb"}]})
    assert resp.status_code == 201 and len(resp.json()["tasks"]) == 11 and all(resp.json()["created"])
    again = server.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "k"}, "idempotency_key": "kb"}]})
    assert again.json()["created"] == [False]
    figures = server.get("/v1/queue").json()
    assert figures["queued"] == 11 and figures["queued_by_priority"] == {"0": 6, "1": 5}
    assert figures["oldest_queued_age_s"] >= 0 and figures["workers_by_status"]["initializing"] >= 1
    leases = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"]
    server.post(f"/v1/tasks/{leases[0]['task_id']}/report", json={
        "worker_id": wid, "lease_token": leases[0]["lease_token"], "status": "failed",
        "error": {"code": "x", "message": "m", "retryable": False}})
    figures = server.get("/v1/queue").json()
    assert figures["queued"] == 10 and figures["ended_last_s"]["60"]["failed"] >= 1
    assert server.post("/v1/tasks/batch", json={"tasks": []}).status_code == 422
    assert server.post("/v1/tasks/batch", json={"tasks": [{"input": {}}] * 1001}).status_code == 422
    drain(server, wid)


def test_reports_travel_together_each_applied_on_its_own(server):
    wid = register(server)
    drain(server, wid)
    server.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": f"r{i}"}} for i in range(3)]})
    leases = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 3}).json()["leases"]
    assert len(leases) == 3
    items = [{"task_id": le["task_id"], "worker_id": wid, "lease_token": le["lease_token"], "status": "processing"}
             for le in leases]
    items[1] = {**items[1], "lease_token": "stale"}
    items.append({"task_id": "nosuchtask", "worker_id": wid, "lease_token": "t", "status": "processing"})
    results = server.post("/v1/reports", json={"reports": items}).json()["results"]
    assert [r["status_code"] for r in results] == [200, 409, 200, 404]
    assert results[0]["task"]["status"] == "processing" and "not held" in results[1]["detail"]
    assert server.get(f"/v1/tasks/{leases[1]['task_id']}").json()["status"] == "leased"  # the refused one: unchanged
    done = [{"task_id": le["task_id"], "worker_id": wid, "lease_token": le["lease_token"], "status": "succeeded",
             "result": {"uri": "file:///x.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 1,
                        "bytes": 1, "sha256": "0"}} for le in leases]
    results = server.post("/v1/reports", json={"reports": done}).json()["results"]
    assert [r["task"]["status"] for r in results] == ["succeeded"] * 3
    assert server.post("/v1/reports", json={"reports": []}).status_code == 422
