"""Waiting without polling, against a real server (both backends): `Prefer: wait=N` on submit and
`GET /v1/tasks/{id}?wait_s=N` answer as soon as the task ends, or after N seconds (capped)."""

from __future__ import annotations

import threading
import time

import httpx

from tests.harness import drain, register

RESULT = {"uri": "file:///x.png", "content_type": "image/png", "width": 64, "height": 64, "seed": 1, "bytes": 1,
          "sha256": "0"}


def finish_soon(server, wid: str, delay_s: float, status: str = "succeeded") -> threading.Thread:
    """A worker that leases the next task and reports it after `delay_s`, on a thread."""
    def work():
        with httpx.Client(base_url=server.base_url, timeout=10) as http:  # its own connections
            resp = http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 5})
            (lease,) = resp.json()["leases"]
            time.sleep(delay_s)  # the simulated generation
            body = {"worker_id": wid, "lease_token": lease["lease_token"], "status": status}
            body.update(result=RESULT) if status == "succeeded" else body.update(
                error={"code": "unsafe_prompt", "message": "no", "retryable": False})
            http.post(f"/v1/tasks/{lease['task_id']}/report", json=body)

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_prefer_wait_answers_with_the_finished_task_in_one_call(server):
    wid = register(server)
    drain(server, wid)
    worker = finish_soon(server, wid, 0.3)
    t0 = time.monotonic()
    resp = server.post("/v1/tasks", json={"input": {"prompt": "a"}}, headers={"Prefer": "respond-async, wait=3"})
    took = time.monotonic() - t0
    worker.join()
    assert resp.status_code == 201 and resp.headers["preference-applied"] == "wait=3"
    assert resp.json()["status"] == "succeeded" and resp.json()["result"]["uri"] == RESULT["uri"]
    assert took < 2.5  # woken by the report, not by the end of the wait


def test_a_wait_past_the_cap_returns_the_task_as_it_stands(server):
    wid = register(server)
    drain(server, wid)
    t0 = time.monotonic()
    resp = server.post("/v1/tasks", json={"input": {"prompt": "b"}}, headers={"Prefer": "wait=600"})
    assert resp.status_code == 201 and resp.headers["preference-applied"] == "wait=3"  # --max-wait 3
    assert resp.json()["status"] == "queued" and 2.9 < time.monotonic() - t0 < 10
    no_wait = server.post("/v1/tasks", json={"input": {"prompt": "c"}})
    assert "preference-applied" not in no_wait.headers and no_wait.json()["status"] == "queued"
    drain(server, wid)


def test_get_long_polls_until_the_task_ends(server):
    wid = register(server)
    drain(server, wid)
    task = server.post("/v1/tasks", json={"input": {"prompt": "d"}}).json()
    worker = finish_soon(server, wid, 0.3, status="failed")
    resp = server.get(f"/v1/tasks/{task['id']}", params={"wait_s": 3})
    worker.join()
    assert resp.status_code == 200 and resp.json()["status"] == "failed"
    ended = server.get(f"/v1/tasks/{task['id']}", params={"wait_s": 3})  # already ended: at once
    assert ended.json()["status"] == "failed" and ended.elapsed.total_seconds() < 1
    assert server.get("/v1/tasks/nope", params={"wait_s": 3}).status_code == 404
    assert server.get(f"/v1/tasks/{task['id']}", params={"wait_s": -1}).status_code == 422


def test_a_cancel_wakes_a_waiting_client(server):
    task = server.post("/v1/tasks", json={"input": {"prompt": "e"}}).json()
    def cancel():
        with httpx.Client(base_url=server.base_url, timeout=10) as http:
            http.post(f"/v1/tasks/{task['id']}/cancel")

    threading.Timer(0.3, cancel).start()
    resp = server.get(f"/v1/tasks/{task['id']}", params={"wait_s": 3})
    assert resp.json()["status"] == "cancelled" and resp.elapsed.total_seconds() < 2.5


def test_a_task_ended_by_another_process_is_found_by_the_shared_poll(make_store):
    """The report goes to the store directly, as another scheduler process's would: no local wake-up."""
    from fastapi.testclient import TestClient

    from protocol import Report, RegisterWorker, SubmitTask, TaskResult
    from scheduler.app import create_app
    from scheduler.config import ApiConfig, WaitsConfig

    store = make_store()
    with TestClient(create_app(store, ApiConfig(waits=WaitsConfig(task_poll_s=0.2)))) as http:
        task = http.post("/v1/tasks", json={"input": {"prompt": "f"}}).json()
        wid, _ = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))
        (lease,) = store.claims.claim(wid, 1)
        threading.Timer(0.3, lambda: store.reports.report(task["id"], Report(
            worker_id=wid, lease_token=lease.lease_token, status="succeeded", result=TaskResult(**RESULT)))).start()
        t0 = time.monotonic()
        resp = http.get(f"/v1/tasks/{task['id']}", params={"wait_s": 5})
        assert resp.json()["status"] == "succeeded" and time.monotonic() - t0 < 2
        assert store.tasks.submit(SubmitTask(input={"prompt": "g"}))[1]  # the store still works from this thread
