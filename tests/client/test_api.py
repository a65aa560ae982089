"""The client library against scripted answers (httpx.MockTransport): every status maps to its error,
retries honour Retry-After and keep the idempotency key, downloads are checked against the sha256."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest

from client import (AsyncClient, AuthError, Client, Conflict, DownloadFailed, InvalidRequest, RateLimited, TaskFailed,
                    TaskNotEnded, TaskNotFound, Unavailable)
from client.api import scheduler_url
from client.errors import ClientError
from tests.harness import Clock

TASK = {"id": "t1", "status": "queued", "input": {"prompt": "x"}, "priority": 0, "attempts": 0, "max_attempts": 3,
        "idempotency_key": "k", "worker_id": None, "result": None, "error": None, "created_at": 1.0,
        "updated_at": 1.0, "started_at": None, "finished_at": None}


def scripted(answers: list, seen: list) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return httpx.MockTransport(handle)


def client(answers, seen=None, deadline=2.0) -> Client:
    return Client("http://q", token="tok", retry_deadline_s=deadline, transport=scripted(answers, seen if seen is not
                                                                                              None else []))


@pytest.mark.parametrize("status, body, error, says", [
    (401, {"detail": "missing or wrong bearer token"}, AuthError, "set DIT_TOKEN"),
    (404, {"detail": "no task t9"}, TaskNotFound, "retention"),
    (409, {"detail": "task t1 has already ended (succeeded); nothing to cancel"}, Conflict, "already ended"),
    (422, {"detail": [{"loc": ["body", "input", "width"], "msg": "must be an integer"}]}, InvalidRequest,
     "input.width: must be an integer"),
    (413, {"detail": "request body over 1048576 bytes"}, InvalidRequest, "over 1048576 bytes"),
])
def test_each_status_is_its_own_error_naming_what_to_do(status, body, error, says):
    with pytest.raises(error, match=says):
        client([httpx.Response(status, json=body)]).get("t1")


def test_429_and_5xx_are_retried_honouring_retry_after_with_the_same_idempotency_key():
    seen: list[httpx.Request] = []
    dit = client([httpx.Response(429, headers={"Retry-After": "0"}, json={"detail": "queue is full"}),
                  httpx.Response(503, json={"detail": "down"}), httpx.ConnectError("refused"),
                  httpx.Response(201, json=TASK)], seen)
    task = dit.submit("x", width=256, height=256, wait_s=5)
    assert task.id == "t1" and len(seen) == 4
    keys = {json.loads(r.content)["idempotency_key"] for r in seen}
    assert len(keys) == 1  # a retried POST cannot make a second task
    assert seen[0].headers["Prefer"] == "wait=5" and seen[0].headers["Authorization"] == "Bearer tok"
    assert json.loads(seen[0].content)["input"] == {"prompt": "x", "width": 256, "height": 256}


def test_after_the_deadline_a_full_queue_is_rate_limited_and_silence_is_unavailable():
    with pytest.raises(RateLimited, match="queue is full") as e:
        client([httpx.Response(429, headers={"Retry-After": "1"}, json={"detail": "queue is full"})] * 5,
               deadline=0.5).get("t1")
    assert e.value.retry_after_s == 1
    with pytest.raises(Unavailable, match="is the scheduler running"):
        client([httpx.ConnectError("refused")] * 50, deadline=0.3).get("t1")


def test_wait_long_polls_until_the_task_ends():
    seen: list[httpx.Request] = []
    done = {**TASK, "status": "failed", "error": {"code": "unsafe_prompt", "message": "no", "retryable": False}}
    updates = []
    task = client([httpx.Response(200, json={**TASK, "status": "processing"}), httpx.Response(200, json=done)],
                  seen).wait("t1", timeout_s=120, on_update=lambda t: updates.append(t.status))
    assert task.status == "failed" and updates == ["processing", "failed"]
    assert all(float(r.url.params["wait_s"]) > 50 for r in seen)  # long polls, not polling


def test_download_checks_the_bytes_and_refuses_a_task_without_a_result(tmp_path):
    src = tmp_path / "src.png"
    src.write_bytes(b"\x89PNG data")
    ok = {**TASK, "status": "succeeded", "result": {"uri": src.as_uri(), "content_type": "image/png", "width": 1,
                                                    "height": 1, "seed": 1, "bytes": 9,
                                                    "sha256": hashlib.sha256(b"\x89PNG data").hexdigest()}}
    dit = client([])
    from protocol import TaskView

    assert dit.download(TaskView(**ok), tmp_path / "out" / "x.png").read_bytes() == b"\x89PNG data"
    bad = TaskView(**{**ok, "result": {**ok["result"], "sha256": "0" * 64}})
    with pytest.raises(DownloadFailed, match="do not match"):
        dit.download(bad, tmp_path / "y.png")
    assert not (tmp_path / "y.png").exists()
    with pytest.raises(TaskNotEnded, match="t1 is still queued: it has no result yet"):
        dit.download(TaskView(**TASK), tmp_path / "z.png")
    failed = {**TASK, "status": "failed", "error": {"code": "unsafe_prompt", "message": "no", "retryable": False}}
    with pytest.raises(TaskFailed, match="t1 failed: unsafe_prompt: no"):
        dit.download(TaskView(**failed), tmp_path / "z.png")
    assert not (tmp_path / "z.png").exists()
    gone = TaskView(**{**ok, "result": {**ok["result"], "uri": "file:///nowhere/x.png"}})
    with pytest.raises(DownloadFailed, match="not on this machine"):
        dit.download(gone, tmp_path / "w.png")


def test_a_wait_that_runs_out_raises_task_not_ended_with_the_task_as_last_seen():
    clock, asked = Clock(), []

    def long_poll(request: httpx.Request) -> httpx.Response:  # answers after the whole wait, task unchanged
        asked.append(float(request.url.params["wait_s"]))
        clock.now += asked[-1]
        return httpx.Response(200, json={**TASK, "status": "processing", "worker_id": "w1"})

    dit = Client("http://q", transport=httpx.MockTransport(long_poll), clock=clock)
    with pytest.raises(TaskNotEnded, match="t1 is still processing after 50s") as e:
        dit.wait("t1", timeout_s=50, poll_s=30)
    assert e.value.task.worker_id == "w1" and isinstance(e.value, ClientError)
    assert asked == [30, 20]  # polls of poll_s, the last cut to what was left


def _succeeded(tmp_path, data: bytes = b"\x89PNG by id") -> dict:
    src = tmp_path / "src.png"
    src.write_bytes(data)
    return {**TASK, "status": "succeeded", "result": {"uri": src.as_uri(), "content_type": "image/png", "width": 1,
                                                      "height": 1, "seed": 1, "bytes": len(data),
                                                      "sha256": hashlib.sha256(data).hexdigest()}}


def test_download_by_id_fetches_the_task_first_in_both_clients(tmp_path):
    seen: list[httpx.Request] = []
    done = _succeeded(tmp_path)
    assert client([httpx.Response(200, json=done)], seen).download("t1", tmp_path / "a.png").read_bytes() == \
        b"\x89PNG by id"
    assert seen[0].url.path == "/v1/tasks/t1" and "wait_s" not in seen[0].url.params  # no waiting

    async def go():
        transport = scripted([httpx.Response(200, json=done), httpx.Response(404, json={"detail": "no task t9"})], [])
        async with AsyncClient("http://q", retry_deadline_s=2, transport=transport) as dit:
            path = await dit.download("t1", tmp_path / "b.png")
            with pytest.raises(TaskNotFound):
                await dit.download("t9", tmp_path / "c.png")
        return path

    assert asyncio.run(go()).read_bytes() == b"\x89PNG by id"


def test_list_tasks_passes_the_filters_and_returns_task_views():
    seen: list[httpx.Request] = []
    page = {"tasks": [TASK, {**TASK, "id": "t2"}]}
    tasks = client([httpx.Response(200, json=page)], seen).list_tasks(status="queued", limit=2, offset=4)
    assert [t.id for t in tasks] == ["t1", "t2"] and tasks[0].status == "queued"
    assert seen[0].url.path == "/v1/tasks" and dict(seen[0].url.params) == {"status": "queued", "limit": "2",
                                                                             "offset": "4"}

    async def go():
        seen_async: list[httpx.Request] = []
        async with AsyncClient("http://q", transport=scripted([httpx.Response(200, json=page)], seen_async)) as dit:
            return await dit.list_tasks(), seen_async

    tasks, seen_async = asyncio.run(go())
    assert len(tasks) == 2 and "status" not in seen_async[0].url.params


def test_the_async_client_maps_and_retries_the_same_way():
    async def go():
        seen: list = []
        transport = scripted([httpx.Response(503, json={"detail": "x"}), httpx.Response(200, json=TASK),
                              httpx.Response(404, json={"detail": "no task t9"})], seen)
        async with AsyncClient("http://q", retry_deadline_s=2, transport=transport) as dit:
            assert (await dit.cancel("t1")).id == "t1"
            with pytest.raises(TaskNotFound):
                await dit.get("t9")
        return seen

    assert len(asyncio.run(go())) == 3


def test_download_from_a_signed_url_sends_no_token(tmp_path):
    from protocol import TaskView

    data = b"\x89PNG signed"
    seen: list[httpx.Request] = []
    url = "https://storage.googleapis.com/b/t1.png?X-Goog-Signature=abc"
    task = TaskView(**{**TASK, "status": "succeeded", "result": {
        "uri": "gs://b/t1.png", "url": url, "content_type": "image/png", "width": 1, "height": 1, "seed": 1,
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}})
    dit = client([httpx.Response(200, content=data)], seen)
    assert dit.download(task, tmp_path / "x.png").read_bytes() == data
    assert str(seen[0].url) == url and "Authorization" not in seen[0].headers
    expired = client([httpx.Response(403, text="<Error>ExpiredToken</Error>")])
    with pytest.raises(DownloadFailed, match="signed URL answered 403: it may have expired"):
        expired.download(task, tmp_path / "y.png")


@pytest.mark.integration
def test_download_from_gcs_with_the_official_client(tmp_path, monkeypatch):
    from protocol import TaskView
    from tests.harness import Emulator

    emu = Emulator(tmp_path)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
        data = b"\x89PNG in a bucket"
        emu.bucket("results").blob("r/t1.png").upload_from_string(data)
        task = TaskView(**{**TASK, "status": "succeeded", "result": {
            "uri": "gs://results/r/t1.png", "content_type": "image/png", "width": 1, "height": 1, "seed": 1,
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}})
        assert client([]).download(task, tmp_path / "g.png").read_bytes() == data
    finally:
        emu.stop()


@pytest.mark.parametrize("given, base", [("127.0.0.1:8700", "http://127.0.0.1:8700"),
                                         ("https://q.example.com/", "https://q.example.com"),
                                         (" http://h:1 ", "http://h:1")])
def test_the_scheduler_url_is_checked_and_completed(given, base):
    assert scheduler_url(given) == base


@pytest.mark.parametrize("given", ["ftp://h:1", "http://", "://x"])
def test_a_scheduler_url_that_cannot_work_is_refused_before_any_call(given):
    with pytest.raises(ValueError, match="not an http.s. address of the scheduler"):
        scheduler_url(given)
