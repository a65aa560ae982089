"""Status-code handling of the queue client, against a fake transport (unit level)."""

import time

import httpx
import pytest

from protocol import Heartbeat, Report
from worker.config import QueueConfig
from worker.serving.queue_client import AuthError, LeaseLost, NotFound, QueueClient, QueueError, Unavailable

LEASES = {"leases": [{"task_id": "t1", "input": {"prompt": "x"}, "lease_token": "tok", "lease_deadline": 1.0,
                      "lease_ttl_s": 1.0, "attempt": 1, "created_at": 1.0}]}
TASK = {"id": "t1", "status": "processing", "input": {}, "priority": 0, "attempts": 1, "max_attempts": 3,
        "idempotency_key": None, "worker_id": "w", "result": None, "error": None, "created_at": 0,
        "updated_at": 0, "started_at": 0, "finished_at": None}


def client(responses: list, seen: list | None = None) -> QueueClient:
    """Answers each request with the next response (an httpx.Response or an exception)."""
    queue = list(responses)

    def handle(request: httpx.Request):
        if seen is not None:
            seen.append((request, time.monotonic()))
        r = queue.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    return QueueClient(QueueConfig(url="http://q", timeout_s=1.0), token="secret",
                       transport=httpx.MockTransport(handle))


def report():
    return Report(worker_id="w", lease_token="tok", status="processing")


def test_lease_200_and_204_and_bearer():
    seen = []
    c = client([httpx.Response(200, json=LEASES), httpx.Response(204)], seen)
    assert [lease.task_id for lease in c.lease("w", 1, 0)] == ["t1"]
    assert c.lease("w", 1, 0) == []
    assert seen[0][0].headers["Authorization"] == "Bearer secret"


@pytest.mark.parametrize("code, exc", [(401, AuthError), (403, AuthError), (404, NotFound),
                                       (409, LeaseLost), (400, QueueError), (422, QueueError),
                                       (429, Unavailable), (500, Unavailable), (503, Unavailable)])
def test_each_status_code_maps_to_one_outcome(code, exc):
    with pytest.raises(QueueError) as e:
        client([httpx.Response(code, json={"detail": "x"})]).lease("w", 1, 0)
    assert type(e.value) is exc  # 400/422: the plain QueueError, which nothing retries


def test_transport_errors_are_unavailable():
    with pytest.raises(Unavailable, match="ConnectError"):
        client([httpx.ConnectError("refused")]).lease("w", 1, 0)


def test_report_retries_5xx_and_transport_errors_then_succeeds():
    c = client([httpx.Response(502), httpx.ReadTimeout("slow"), httpx.Response(200, json=TASK)])
    assert c.report("t1", report(), deadline_s=10).status == "processing"


def test_retry_after_is_honoured():
    seen = []
    c = client([httpx.Response(429, headers={"Retry-After": "1"}), httpx.Response(200, json=TASK)], seen)
    c.report("t1", report(), deadline_s=10)
    assert seen[1][1] - seen[0][1] >= 0.95


def test_lease_lost_is_not_retried():
    seen = []
    with pytest.raises(LeaseLost):
        client([httpx.Response(409, json={"detail": "stale"}), httpx.Response(200, json=TASK)],
               seen).report("t1", report(), deadline_s=10)
    assert len(seen) == 1


def test_retries_stop_at_the_deadline():
    t0 = time.monotonic()
    with pytest.raises(Unavailable):
        client([httpx.Response(503)] * 100).heartbeat(
            "w", Heartbeat(status="ready", timestamp=0), deadline_s=1.0)
    assert time.monotonic() - t0 < 3


def test_unexpected_body_is_an_error():
    with pytest.raises(Exception):
        client([httpx.Response(200, json={"nonsense": True})]).lease("w", 1, 0)


def test_reports_together_give_each_its_status_code_and_a_missing_endpoint_is_not_found():
    from protocol import TaskReport

    seen = []
    outcomes = {"results": [{"task_id": "t1", "status_code": 200, "task": TASK},
                            {"task_id": "t2", "status_code": 409, "detail": "stale"}]}
    c = client([httpx.Response(200, json=outcomes), httpx.Response(404, json={"detail": "Not Found"})], seen)
    reports = [TaskReport(task_id=t, **report().model_dump()) for t in ("t1", "t2")]
    got = c.report_many(reports, deadline_s=1.0)
    assert [(o.task_id, o.status_code) for o in got] == [("t1", 200), ("t2", 409)]
    assert seen[0][0].url.path == "/v1/reports"
    with pytest.raises(NotFound):  # an older scheduler: the reporter falls back to one call per report
        c.report_many(reports, deadline_s=1.0)
