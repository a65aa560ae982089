"""The hot path (scheduler/api/hot.py): a task's calls (submit, lease, heartbeat, report, exchange) give the
same answers with it as through FastAPI, and with it they skip FastAPI's dependency solving."""

from __future__ import annotations

import time

import fastapi.routing
import pytest

from tests.scheduler.hot_answers import both, client
from bench.fleet import REG

TASK = {"input": {"prompt": "a lighthouse at dusk"}}


def lifecycle(http) -> list:
    """One task from submit to success, with a replay, an empty lease and a batch report."""
    wid = http.post("/v1/workers", json={**REG, "world_size": 1}).json()["worker_id"]
    out = [http.post("/v1/tasks", json=TASK),
           http.post("/v1/tasks", json={**TASK, "idempotency_key": "k-1"}),
           http.post("/v1/tasks", json={**TASK, "idempotency_key": "k-1"}),  # a replay: 200
           http.post("/v1/tasks", json=TASK, headers={"Prefer": "wait=0"}),
           http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 2, "wait_s": 0})]
    leases = out[-1].json()["leases"]
    out.append(http.post(f"/v1/workers/{wid}/heartbeat", json={
        "status": "ready", "in_flight": [le["task_id"] for le in leases], "timestamp": time.time()}))
    first, second = leases
    out.append(http.post(f"/v1/tasks/{first['task_id']}/report", json={
        "worker_id": wid, "lease_token": first["lease_token"], "status": "processing"}))
    out.append(http.post(f"/v1/tasks/{first['task_id']}/report", json={
        "worker_id": wid, "lease_token": first["lease_token"], "status": "succeeded",
        "result": {"uri": "file:///tmp/a.png", "content_type": "image/png", "width": 64, "height": 64,
                   "seed": 1, "bytes": 100, "sha256": "0" * 64, "timings_ms": {"generate": 512.5}}}))
    out.append(http.post("/v1/reports", json={"reports": [{
        "task_id": second["task_id"], "worker_id": wid, "lease_token": second["lease_token"], "status": "released"}]}))
    out.append(http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 4, "wait_s": 0}))
    out.append(http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 0}))  # none left: 204
    # The same kind of task through the exchange: claimed, the claim answered again to a retry,
    # its start and its result in one call.
    out.append(http.post("/v1/tasks", json=TASK))
    out.append(http.post(f"/v1/workers/{wid}/exchange", json={"exchange_id": "e-1", "max_tasks": 1}))
    out.append(http.post(f"/v1/workers/{wid}/exchange", json={"exchange_id": "e-1", "retry": True, "max_tasks": 1}))
    third = out[-1].json()["leases"][0]
    out.append(http.post(f"/v1/workers/{wid}/exchange", json={"exchange_id": "e-2", "reports": [
        {"task_id": third["task_id"], "worker_id": wid, "lease_token": third["lease_token"], "status": "processing",
         "at": time.time()},
        {"task_id": third["task_id"], "worker_id": wid, "lease_token": third["lease_token"], "status": "succeeded",
         "result": {"uri": "file:///tmp/c.png", "content_type": "image/png", "width": 64, "height": 64,
                    "seed": 3, "bytes": 100, "sha256": "0" * 64}}], "held": [], "max_tasks": 1}))
    return out


def test_a_tasks_calls_get_the_same_answers_with_the_hot_path_as_through_fastapi(tmp_path):
    hot, plain = both(tmp_path, lifecycle)
    assert hot == plain
    assert [status for status, _, _ in hot] == [201, 201, 200, 201, 200, 200, 200, 200, 200, 200, 204, 201, 200, 200, 200]
    assert hot[3][1]["preference-applied"] == "wait=0"
    assert hot[-2][2]["leases"] == hot[-3][2]["leases"] != []  # the retry got the claim, not another
    assert [r["status_code"] for r in hot[-1][2]["results"]] == [200, 200]


@pytest.mark.parametrize("hot", [True, False])
def test_with_the_hot_path_a_tasks_calls_solve_no_fastapi_dependencies(tmp_path, monkeypatch, hot):
    solved = []
    real = fastapi.routing.solve_dependencies

    async def counted(*args, **kwargs):
        solved.append(kwargs["request"].url.path)
        return await real(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    with client(tmp_path, hot) as http:
        answers = lifecycle(http)
    assert all(r.status_code < 300 for r in answers)
    through_fastapi = [p for p in solved if p != "/v1/workers"]  # registration is not a hot call
    assert (through_fastapi == []) is hot, through_fastapi


def test_the_request_timer_labels_hot_calls_by_their_route(tmp_path):
    with client(tmp_path, True) as http:
        http.post("/v1/tasks", json=TASK)
        metrics = http.get("/metrics").text
    assert 'dit_scheduler_request_seconds_count{code="201",method="POST",route="/v1/tasks"} 1.0' in metrics
