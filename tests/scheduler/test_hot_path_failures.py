"""The hot path's refusals are FastAPI's: a call it does not take (bad JSON, another content type, a
body that does not validate, a token not admitted, a body over the limit) and a route's refusal (the
store's 404/409, admission's 429 with its Retry-After) answer exactly as without it, and a call it
hands over has lost nothing of its body."""

from __future__ import annotations

import asyncio

from scheduler.api.hot import _HotRequest, _read, _replay
from scheduler.config import GateConfig, Secrets
from tests.scheduler.hot_answers import both
from bench.fleet import REG

TASK = {"input": {"prompt": "a lighthouse at dusk"}}
HEARTBEAT = {"status": "ready", "in_flight": [], "timestamp": 0.0}


def malformed(http) -> list:
    wid = http.post("/v1/workers", json={**REG, "world_size": 1}).json()["worker_id"]
    return [
        http.post("/v1/tasks", content=b'{"input": {"prompt": ', headers={"content-type": "application/json"}),
        http.post("/v1/tasks", content=b"", headers={"content-type": "application/json"}),
        http.post("/v1/tasks", content=b"null", headers={"content-type": "application/json"}),
        http.post("/v1/tasks", content=b'{"input": {"prompt": "x"}}', headers={"content-type": "text/plain"}),
        http.post("/v1/tasks", content=b'{"input": {"prompt": "x"}}'),  # no content type: FastAPI (0.165) wants one
        http.post("/v1/tasks", json={"input": {"prompt": "x"}, "priority": "high"}),
        http.post("/v1/tasks", json={"input": {"prompt": "x"}, "unknown": 1}),
        http.post("/v1/tasks", content=b'{"input": {"prompt": "x"}, "priority": NaN}',
                  headers={"content-type": "application/json"}),
        http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 0}),
        http.post(f"/v1/workers/{wid}/heartbeat", json={**HEARTBEAT, "status": "sleeping"}),
        http.post("/v1/tasks/t-1/report", json={"worker_id": wid, "lease_token": "x", "status": "succeeded"}),
        http.post("/v1/reports", json={"reports": []}),
        http.post("/v1/tasks", content=b"[" * 100_000, headers={"content-type": "application/json"}),
    ]


def test_a_body_the_hot_path_does_not_take_gets_fastapis_own_answer(tmp_path):
    hot, plain = both(tmp_path, malformed)
    assert hot == plain
    assert [status for status, _, _ in hot] == [422] * 12 + [400]  # too deep to parse: 400


def refused(http) -> list:
    """Tokens on: none, a wrong one, a client's token on a worker's call, then the store's refusals."""
    worker, bearer = {"Authorization": "Bearer w-token"}, {"Authorization": "Bearer c-token"}
    wid = http.post("/v1/workers", json={**REG, "world_size": 1}, headers=worker).json()["worker_id"]
    return [
        http.post("/v1/tasks", json=TASK),
        http.post("/v1/tasks", json=TASK, headers={"Authorization": "Bearer nope"}),
        http.post("/v1/tasks", json=TASK, headers={"Authorization": "Basic Yzpj"}),
        http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}, headers=bearer),
        http.post(f"/v1/workers/{wid}/heartbeat", json=HEARTBEAT),
        http.post("/v1/reports", json={"reports": [{"task_id": "t", "worker_id": wid, "lease_token": "x",
                                                    "status": "released"}]}, headers=bearer),
        http.post("/v1/workers/w-nobody/heartbeat", json=HEARTBEAT, headers=worker),
        http.post("/v1/workers/w-nobody/lease", json={"max_tasks": 1}, headers=worker),
        http.post("/v1/tasks/t-none/report", json={"worker_id": wid, "lease_token": "x", "status": "processing"},
                  headers=worker),
        http.post("/v1/tasks", json={**TASK, "idempotency_key": "k"}, headers=bearer),
        http.post("/v1/tasks", json={"input": {"prompt": "other"}, "idempotency_key": "k"}, headers=bearer),
        http.post("/v1/tasks", json=TASK, headers=bearer),
        http.post("/v1/tasks", json=TASK, headers=bearer),  # the queue holds 2: full
    ]


def test_refusals_are_the_same_with_the_hot_path_tokens_store_errors_and_a_full_queue(tmp_path):
    secrets = Secrets(worker_tokens=frozenset({"w-token"}), client_tokens=frozenset({"c-token"}))
    hot, plain = both(tmp_path, refused, secrets=secrets, gate=GateConfig(max_queued=2, read_s=0))
    assert hot == plain
    assert [status for status, _, _ in hot] == [401, 401, 401, 401, 401, 401, 404, 404, 404, 201, 409, 201, 429]
    assert hot[0][1]["www-authenticate"] == "Bearer"
    assert int(hot[-1][1]["retry-after"]) >= 1


def over_the_limit(http) -> list:
    big = {"input": {"prompt": "x" * 5000}}
    chunks = (piece for piece in (b'{"input": {"prompt": "', b"x" * 5000, b'"}}'))  # chunked: no Content-Length
    return [http.post("/v1/tasks", json=big),
            http.post("/v1/tasks", content=chunks, headers={"content-type": "application/json"})]


def test_a_body_over_the_limit_is_a_413_with_the_hot_path_too(tmp_path):
    hot, plain = both(tmp_path, over_the_limit, max_body_bytes=1000)
    assert hot == plain
    assert [status for status, _, _ in hot] == [413, 413]


def test_a_call_handed_over_keeps_its_body_and_then_the_clients_own_messages():
    sent = [{"type": "http.request", "body": b'{"a": ', "more_body": True},
            {"type": "http.request", "body": b"1}", "more_body": False},
            {"type": "http.disconnect"}]

    async def scenario():
        queue = list(sent)

        async def receive():
            return queue.pop(0)

        received, body = await _read(receive)
        replay = _replay(received, receive)
        return body, [await replay() for _ in sent]

    body, replayed = asyncio.run(scenario())
    assert body == b'{"a": 1}'
    assert replayed == sent


def test_a_client_that_leaves_while_sending_its_body_is_handed_over_with_what_came():
    sent = [{"type": "http.request", "body": b'{"a": ', "more_body": True}, {"type": "http.disconnect"}]

    async def scenario():
        queue = list(sent)

        async def receive():
            return queue.pop(0)

        return await _read(receive)

    received, body = asyncio.run(scenario())
    assert (received, body) == (sent, None)


def test_a_hot_calls_disconnect_check_takes_a_message_that_is_there_and_waits_for_none():
    """As uvicorn's receive: it waits on an event until the client leaves, then says so."""

    async def scenario():
        arrived, left = asyncio.Event(), []

        async def receive():
            if not left:
                await arrived.wait()
            return {"type": "http.disconnect"}

        request = _HotRequest({"type": "http", "headers": []}, receive)
        still = await request.is_disconnected()
        nothing_waits = not arrived._waiters  # the receive it stepped was closed where it waited
        later = asyncio.create_task(receive())  # the client's own next receive still works
        await asyncio.sleep(0)
        left.append(1)
        arrived.set()
        return still, nothing_waits, await asyncio.wait_for(later, 5), await request.is_disconnected()

    still, nothing_waits, later, gone = asyncio.run(scenario())
    assert (still, nothing_waits, later["type"], gone) == (False, True, "http.disconnect", True)
