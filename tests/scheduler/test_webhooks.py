"""Webhooks against a real scheduler process and a real receiver on 127.0.0.1: signed calls, retries
with backoff until a 2xx, the attempts on the task, and hosts the operator did not allow refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from launch.local import free_port, start_scheduler, wait_until
from scheduler.webhooks import refusal
from tests.harness import register

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

SECRET = "a long random string shared with the receiver"
RESULT = {"uri": "file:///x.png", "content_type": "image/png", "width": 64, "height": 64, "seed": 1, "bytes": 1,
          "sha256": "0"}


class Receiver:
    """Answers 500 to the first `fail` calls, then 200; keeps every call."""

    def __init__(self, fail: int) -> None:
        self.calls: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.calls.append({"headers": dict(self.headers), "body": body, "at": time.monotonic()})
                self.send_response(500 if len(receiver.calls) <= fail else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver():
    r = Receiver(fail=2)
    yield r
    r.close()


@pytest.fixture
def scheduler(tmp_path, receiver):
    port = free_port()
    proc = start_scheduler(tmp_path / "s.db", port, tmp_path / "s.log",
                           extra=["--api-webhooks-allow", f"127.0.0.1:{receiver.port}"], env={"DIT_WEBHOOK_SECRET": SECRET})
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        yield http
    proc.stop()


def valid(call: dict) -> bool:
    stamp = call["headers"]["Dit-Webhook-Timestamp"]
    want = "v1=" + hmac.new(SECRET.encode(), f"{stamp}.".encode() + call["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, call["headers"]["Dit-Webhook-Signature"]) and abs(time.time() - int(stamp)) < 60


def test_the_final_call_is_signed_and_retried_until_the_receiver_takes_it(scheduler, receiver):
    url = f"http://127.0.0.1:{receiver.port}/hook"
    task = scheduler.post("/v1/tasks", json={"input": {"prompt": "a"}, "webhook": {"url": url}}).json()
    assert task["webhook"] == {"url": url, "events": ["ended"]}
    wid = register(scheduler)
    (lease,) = scheduler.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"]
    scheduler.post(f"/v1/tasks/{task['id']}/report", json={"worker_id": wid, "lease_token": lease["lease_token"],
                                                            "status": "succeeded", "result": RESULT})
    wait_until(lambda: len(receiver.calls) >= 3, 30, "three deliveries")
    first, second, third = receiver.calls[:3]
    assert all(valid(c) for c in (first, second, third))
    assert second["at"] - first["at"] >= 0.9 and third["at"] - second["at"] >= 1.9  # backoff 1 s, then 2 s
    assert {c["headers"]["Dit-Webhook-Id"] for c in receiver.calls} == {f"{task['id']}:ended"}
    sent = json.loads(third["body"])
    assert sent["event"] == "ended" and sent["task"]["status"] == "succeeded" and sent["task"]["result"]["uri"]
    attempts = wait_until(lambda: (a := scheduler.get(f"/v1/tasks/{task['id']}").json()["webhook_attempts"])
                          and len(a) == 3 and a, 10, "the attempts on the task")
    assert [(a["status_code"], a["delivered"]) for a in attempts] == [(500, False), (500, False), (200, True)]
    time.sleep(2.5)  # delivered: no further call (the next retry would have come after 4 s)
    assert len(receiver.calls) == 3
    metrics = scheduler.get("/metrics").text
    assert 'dit_scheduler_webhooks_total{event="ended",outcome="failed"} 2.0' in metrics
    assert 'dit_scheduler_webhooks_total{event="ended",outcome="delivered"} 1.0' in metrics


def test_a_forged_signature_or_a_replayed_timestamp_fails_the_check():
    body = b'{"event":"ended"}'
    stamp = int(time.time())
    good = {"headers": {"Dit-Webhook-Timestamp": str(stamp), "Dit-Webhook-Signature": "v1=" + hmac.new(
        SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()}, "body": body}
    assert valid(good)
    assert not valid({**good, "body": b'{"event":"started"}'})
    old = {**good, "headers": {**good["headers"], "Dit-Webhook-Timestamp": str(stamp - 3600)}}
    assert not valid(old)


def test_a_started_call_when_asked_and_unknown_hosts_refused_at_submission(scheduler, receiver):
    for url, why in ((f"http://10.0.0.1:{receiver.port}/x", "is not one this scheduler may call"),
                     ("http://169.254.169.254/latest/meta-data", "is not one this scheduler may call"),
                     (f"http://127.0.0.1:{receiver.port + 1}/x", "is not one this scheduler may call"),
                     ("ftp://127.0.0.1/x", "String should match pattern")):
        resp = scheduler.post("/v1/tasks", json={"input": {"prompt": "a"}, "webhook": {"url": url}})
        assert resp.status_code == 422 and why in json.dumps(resp.json()), (url, resp.text)
    batch = scheduler.post("/v1/tasks/batch", json={"tasks": [
        {"input": {"prompt": "ok"}}, {"input": {"prompt": "b"}, "webhook": {"url": "http://evil.example/x"}}]})
    assert batch.status_code == 422 and batch.json()["detail"].startswith("tasks[1]:")
    url = f"http://127.0.0.1:{receiver.port}/hook"
    task = scheduler.post("/v1/tasks", json={"input": {"prompt": "s"},
                                             "webhook": {"url": url, "events": ["started", "ended"]}}).json()
    wid = register(scheduler)
    (lease,) = scheduler.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"]
    scheduler.post(f"/v1/tasks/{task['id']}/report", json={"worker_id": wid, "lease_token": lease["lease_token"],
                                                            "status": "processing"})
    wait_until(lambda: any(json.loads(c["body"])["event"] == "started" for c in receiver.calls), 30, "started")


def test_the_allowlist_matches_hosts_ports_and_domains():
    allow = ("hooks.example.com", "127.0.0.1:9000", "*.customer.io")
    assert refusal("https://hooks.example.com/x", allow) is None
    assert refusal("http://127.0.0.1:9000/x", allow) is None
    assert refusal("http://127.0.0.1:9001/x", allow) is not None
    assert refusal("https://a.b.customer.io/x", allow) is None
    assert refusal("https://customer.io.evil.com/x", allow) is not None
    assert refusal("https://hooks.example.com/x", ()).startswith("webhooks are off")


def test_webhooks_without_a_signing_key_are_refused_at_start(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DIT_WEBHOOK_SECRET"}
    out = subprocess.run([sys.executable, "-m", "scheduler", "--database-url", str(tmp_path / "s.db"), "--server-port", "0",
                          "--api-webhooks-allow", "hooks.example.com"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "api.webhooks.allow: webhooks need a signing key: set DIT_WEBHOOK_SECRET" in out.stderr
