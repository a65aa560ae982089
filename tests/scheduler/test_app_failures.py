"""Refusals over HTTP: stale tokens, unknown workers, auth, backpressure, unsafe binding."""

from __future__ import annotations

import httpx

import pytest

from launch.local import free_port, start_scheduler
from scheduler.__main__ import main as scheduler_main
from tests.harness import REG, drain, register

RESULT = {"uri": "file:///x.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 7,
          "bytes": 10, "sha256": "00"}


def test_stale_lease_token_is_refused(server):
    w1, w2 = register(server), register(server)
    drain(server, w1)
    t = server.post("/v1/tasks", json={"input": {"prompt": "stale"}}).json()
    first = server.post(f"/v1/workers/{w1}/lease", json={"max_tasks": 1}).json()["leases"][0]
    # The lease ttl is 1 s: the long poll is woken when the sweep puts the task back in the queue.
    second = server.post(f"/v1/workers/{w2}/lease", json={"max_tasks": 1, "wait_s": 10}).json()["leases"][0]
    assert second["task_id"] == t["id"] and second["attempt"] == 2
    late = server.post(f"/v1/tasks/{t['id']}/report",
                       json={"worker_id": w1, "lease_token": first["lease_token"], "status": "succeeded",
                             "result": {**RESULT, "uri": "file:///late.png"}})
    assert late.status_code == 409
    assert server.get(f"/v1/tasks/{t['id']}").json()["status"] == "leased"
    ok = server.post(f"/v1/tasks/{t['id']}/report",
                     json={"worker_id": w2, "lease_token": second["lease_token"], "status": "succeeded",
                           "result": RESULT})
    assert ok.status_code == 200 and ok.json()["result"]["uri"] == "file:///x.png"


def test_unknown_worker_is_404(server):
    assert server.post("/v1/workers/w-nobody/lease", json={"max_tasks": 1}).status_code == 404
    assert server.post("/v1/workers/w-nobody/heartbeat",
                       json={"status": "ready", "timestamp": 0}).status_code == 404


def test_malformed_bodies_are_422(server):
    assert server.post("/v1/tasks", json={"input": "not an object"}).status_code == 422
    assert server.post("/v1/tasks", json={"input": {}, "surprise": 1}).status_code == 422
    assert server.post("/v1/workers", json={**REG, "world_size": 0}).status_code == 422


def test_a_submit_without_a_prompt_is_422_naming_it_in_the_validators_own_words(server):
    for inp, why in (({}, "input.prompt: required, a string"), ({"prompt": "  "}, "input.prompt: must not be empty")):
        resp = server.post("/v1/tasks", json={"input": inp})
        assert resp.status_code == 422
        assert [(e["loc"], e["msg"]) for e in resp.json()["detail"]] == [(["body", "input"], why)]
    batch = server.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "ok"}}, {"input": {"prompt": ""}}]})
    assert batch.status_code == 422 and batch.json()["detail"][0]["loc"] == ["body", "tasks", 1, "input"]


def test_queue_full_is_429_with_retry_after(server):
    wid = register(server)
    drain(server, wid)
    codes = [server.post("/v1/tasks", json={"input": {"prompt": str(i)}}).status_code for i in range(51)]
    assert codes[:50] == [201] * 50 and codes[50] == 429
    resp = server.post("/v1/tasks", json={"input": {"prompt": "more"}})
    assert resp.status_code == 429 and int(resp.headers["Retry-After"]) > 0
    drain(server, wid)


@pytest.fixture
def authed(tmp_path, monkeypatch):
    monkeypatch.setenv("DIT_WORKER_TOKENS", "wtok")
    monkeypatch.setenv("DIT_CLIENT_TOKENS", "ctok1,ctok2")
    port = free_port()
    proc = start_scheduler(tmp_path / "a.db", port, tmp_path / "a.log")
    yield f"http://127.0.0.1:{port}"
    proc.stop()


@pytest.mark.integration
def test_bearer_tokens_for_clients_and_workers(authed):
    def post(path, body, token=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(authed + path, json=body, headers=headers, timeout=5).status_code

    assert post("/v1/tasks", {"input": {"prompt": "x"}}) == 401
    assert post("/v1/tasks", {"input": {"prompt": "x"}}, "wtok") == 401  # a worker token is not a client's
    assert post("/v1/tasks", {"input": {"prompt": "x"}}, "ctok2") == 201
    assert post("/v1/workers", REG, "ctok1") == 401
    assert post("/v1/workers", REG, "wtok") == 201
    assert httpx.get(authed + "/healthz").status_code == 200


def test_refuses_non_loopback_without_tokens(monkeypatch, tmp_path):
    monkeypatch.delenv("DIT_WORKER_TOKENS", raising=False)
    monkeypatch.delenv("DIT_CLIENT_TOKENS", raising=False)
    assert scheduler_main(["--host", "0.0.0.0", "--db", str(tmp_path / "x.db")]) == 2
    assert not (tmp_path / "x.db").exists()


def test_hostile_input_is_answered_with_4xx_never_5xx(server):
    # Each of these answered 500, or was accepted, before.
    assert server.get("/v1/tasks", params={"offset": "99999999999999999999"}).status_code == 422
    wid = register(server)
    nan = server.post(f"/v1/workers/{wid}/lease", content=b'{"max_tasks": 1, "wait_s": NaN}',
                      headers={"content-type": "application/json"})
    assert nan.status_code == 422 and nan.json()["detail"][0]["loc"] == ["body", "wait_s"]
    inf = server.post(f"/v1/workers/{wid}/heartbeat", content=b'{"status": "ready", "timestamp": Infinity}',
                      headers={"content-type": "application/json"})
    assert inf.status_code == 422
    assert server.post("/v1/tasks", json={"input": {"prompt": "x" * (2 << 20)}}).status_code == 413
    chunked = server.post("/v1/tasks", content=(b"x" * 65536 for _ in range(40)),
                          headers={"content-type": "application/json"})
    assert chunked.status_code == 413  # no Content-Length: counted as it arrives
    devices = [{"name": "cpu", "memory_bytes": 1}] * 5000
    assert server.post("/v1/workers", json={**REG, "devices": devices}).status_code == 422
    beat = {"status": "ready", "timestamp": 0, "in_flight": [f"t{i}" for i in range(5000)]}
    assert server.post(f"/v1/workers/{wid}/heartbeat", json=beat).status_code == 422


def test_text_that_cannot_be_stored_is_422(server):
    # Found by schemathesis: a non-ASCII lease token made compare_digest raise (500); a lone
    # surrogate has no UTF-8 form, so neither the database nor a JSON answer could hold it.
    wid = register(server)
    odd = server.post("/v1/tasks/x/report", json={"worker_id": wid, "lease_token": "tök", "status": "processing"})
    assert odd.status_code == 422
    lone = server.post("/v1/tasks", content=b'{"input": {"prompt": "\\ud83d"}}',
                       headers={"content-type": "application/json"})
    assert lone.status_code == 422 and "lone surrogate" in lone.text


def test_cancel_over_http_queued_held_finished_and_unknown(server):
    from tests.harness import drain, register

    wid = register(server)
    drain(server, wid)
    queued = server.post("/v1/tasks", json={"input": {"prompt": "q"}}).json()
    resp = server.post(f"/v1/tasks/{queued['id']}/cancel")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert server.post(f"/v1/tasks/{queued['id']}/cancel").status_code == 409
    assert server.post("/v1/tasks/nope/cancel").status_code == 404
    held = server.post("/v1/tasks", json={"input": {"prompt": "h"}}).json()
    (lease,) = server.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"]
    marked = server.post(f"/v1/tasks/{held['id']}/cancel").json()
    assert marked["status"] == "leased" and marked["cancel_requested_at"] is not None
    beat = server.post(f"/v1/workers/{wid}/heartbeat", json={"status": "ready", "in_flight": [held["id"]],
                                                              "timestamp": 0}).json()
    assert beat["cancelled"] == [held["id"]]
    refused = server.post(f"/v1/tasks/{held['id']}/report", json={
        "worker_id": wid, "lease_token": lease["lease_token"], "status": "succeeded",
        "result": {"uri": "file:///x.png", "content_type": "image/png", "width": 1, "height": 1, "seed": 1,
                   "bytes": 1, "sha256": "0"}})
    assert refused.status_code == 409 and "cancelled" in refused.json()["detail"]
    assert server.get(f"/v1/tasks/{held['id']}").json()["status"] == "cancelled"


def test_a_prompt_with_a_bidirectional_control_is_422_naming_the_field_and_the_code_point(server):
    refused = server.post("/v1/tasks", json={"input": {"prompt": "invoice \u202efdp.exe"}})
    assert refused.status_code == 422
    [err] = refused.json()["detail"]
    assert err["loc"] == ["body", "input"] and "input.prompt: contains U+202E (RIGHT-TO-LEFT OVERRIDE)" in err["msg"]
    batch = server.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "fine"}},
                                                          {"input": {"prompt": "\u2067isolated"}}]})
    assert batch.status_code == 422
    [err] = batch.json()["detail"]
    assert err["loc"] == ["body", "tasks", 1, "input"] and "U+2067 (RIGHT-TO-LEFT ISOLATE)" in err["msg"]
    # A mark only sets the direction of its neighbours (and opens no scope): right-to-left text uses it.
    assert server.post("/v1/tasks", json={"input": {"prompt": "\u05e9\u05dc\u05d5\u05dd\u200f!"}}).status_code == 201
