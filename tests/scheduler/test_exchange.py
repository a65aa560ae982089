"""POST /v1/workers/{wid}/exchange, a worker's one call per task (docs/protocol.md, "One call per
task"), on the real scheduler and both stores: reports applied as POST /v1/reports applies them,
a processing note's own time as the task's start, cancel notices for what the worker holds, and
a retried exchange answered the leases it first claimed rather than claiming more."""

from __future__ import annotations

import time
import uuid

from tests.harness import drain, register

RESULT = {"uri": "file:///tmp/x.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 1,
          "bytes": 1, "sha256": "0" * 64}


def submit(server, n: int) -> list[str]:
    return [server.post("/v1/tasks", json={"input": {"prompt": f"exchange {i}"}}).json()["id"] for i in range(n)]


def exchange(server, wid: str, **body) -> dict:
    resp = server.post(f"/v1/workers/{wid}/exchange", json={"exchange_id": uuid.uuid4().hex, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def report(lease: dict, wid: str, status: str, **extra) -> dict:
    return {"task_id": lease["task_id"], "worker_id": wid, "lease_token": lease["lease_token"], "status": status,
            **extra}


def test_one_call_reports_what_ended_notes_what_started_and_takes_the_next(server):
    wid = register(server)
    drain(server, wid)
    ids = submit(server, 3)
    first = exchange(server, wid, max_tasks=2)
    assert first["results"] == [] and first["cancelled"] == []
    a, b = first["leases"]
    assert [a["task_id"], b["task_id"]] == ids[:2]
    started = time.time() - 0.5  # the worker started `a` before this call, and says when
    second = exchange(server, wid, reports=[report(a, wid, "processing", at=started)], held=[b["task_id"]],
                      max_tasks=1)
    assert second["results"] == [{"task_id": a["task_id"], "status_code": 200, "task": None, "detail": None}]
    task = server.get(f"/v1/tasks/{a['task_id']}").json()  # outcomes carry codes, not tasks
    assert task["status"] == "processing"
    assert task["started_at"] == max(started, task["created_at"])
    assert [le["task_id"] for le in second["leases"]] == [ids[2]]
    c = second["leases"][0]
    third = exchange(server, wid, reports=[report(a, wid, "succeeded", result=RESULT),
                                           report(b, wid, "processing", at=time.time() + 3600)],
                     held=[b["task_id"], c["task_id"]], max_tasks=1)
    assert [r["status_code"] for r in third["results"]] == [200, 200]
    assert server.get(f"/v1/tasks/{a['task_id']}").json()["status"] == "succeeded"
    b_task = server.get(f"/v1/tasks/{b['task_id']}").json()
    assert b_task["status"] == "processing"
    assert b_task["started_at"] <= b_task["updated_at"]  # a clock ahead cannot start it in the future
    assert third["leases"] == []  # the queue is empty: a call that waits for none answers at once
    exchange(server, wid, reports=[report(b, wid, "released"), report(c, wid, "released")])
    drain(server, wid)


def test_the_answer_names_the_held_tasks_a_client_cancelled(server):
    wid = register(server)
    drain(server, wid)
    submit(server, 2)
    a, b = exchange(server, wid, max_tasks=2)["leases"]
    assert server.post(f"/v1/tasks/{b['task_id']}/cancel").status_code == 200
    out = exchange(server, wid, reports=[report(a, wid, "processing")], held=[b["task_id"], "not-a-task"])
    assert out["cancelled"] == [b["task_id"]]
    # Its worker drops it before generation and says so: the task ends cancelled.
    out = exchange(server, wid, reports=[
        report(b, wid, "failed", error={"code": "cancelled", "message": "dropped", "retryable": False}),
        report(a, wid, "succeeded", result=RESULT)])
    assert [r["status_code"] for r in out["results"]] == [409, 200]
    assert server.get(f"/v1/tasks/{b['task_id']}").json()["status"] == "cancelled"


def test_a_retried_exchange_gets_the_leases_it_claimed_not_more(server):
    wid = register(server)
    drain(server, wid)
    ids = submit(server, 3)
    body = {"exchange_id": "x-" + uuid.uuid4().hex, "max_tasks": 1}
    first = server.post(f"/v1/workers/{wid}/exchange", json=body).json()["leases"]
    # Its answer was lost (a timeout): the worker sends the same exchange again, marked a retry.
    again = server.post(f"/v1/workers/{wid}/exchange", json={**body, "retry": True}).json()["leases"]
    assert [(le["task_id"], le["lease_token"]) for le in again] == [(le["task_id"], le["lease_token"]) for le in first]
    queued = server.get("/v1/tasks", params={"status": "queued"}).json()["tasks"]
    assert sorted(t["id"] for t in queued) == sorted(ids[1:])  # nothing else was claimed
    # Its result, sent twice (the first answer lost too), is stored once and answered alike.
    done = [report(first[0], wid, "succeeded", result=RESULT)]
    one = exchange(server, wid, reports=done)["results"][0]
    two = exchange(server, wid, reports=done)["results"][0]
    assert one["status_code"] == two["status_code"] == 200
    assert server.get(f"/v1/tasks/{first[0]['task_id']}").json()["result"]["uri"] == RESULT["uri"]
    # A retry after the task started claims afresh: the first claim is no longer answerable.
    fresh = server.post(f"/v1/workers/{wid}/exchange", json={**body, "retry": True}).json()["leases"]
    assert [le["task_id"] for le in fresh] == [ids[1]]
    exchange(server, wid, reports=[report(le, wid, "released") for le in fresh])
    drain(server, wid)


def test_an_unknown_worker_is_told_to_register(server):
    assert server.post("/v1/workers/nobody/exchange", json={"exchange_id": "e1"}).status_code == 404
    assert server.post("/v1/workers/nobody/exchange", json={"exchange_id": "e2", "max_tasks": 1}).status_code == 404


def test_bad_exchanges_are_refused_naming_the_field(server):
    wid = register(server)
    for body, field in (({}, "exchange_id"), ({"exchange_id": "e", "max_tasks": 257}, "max_tasks"),
                        ({"exchange_id": "e", "wait_s": 61}, "wait_s"),
                        ({"exchange_id": "e", "reports": [{"task_id": "t", "worker_id": wid, "lease_token": "x",
                                                           "status": "processing", "at": "soon"}]}, "at")):
        resp = server.post(f"/v1/workers/{wid}/exchange", json=body)
        assert resp.status_code == 422, body
        assert field in str([d["loc"] for d in resp.json()["detail"]])
