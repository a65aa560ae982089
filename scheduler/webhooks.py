"""Webhooks: the scheduler (never the worker) calls a task's URL when it ends, and when it starts if
asked, off the request path. A receiver that is down or slow delays nothing but its own calls.

Each call is a POST of `{"event": "started"|"ended", "task": <the task>}` with three headers:

    Dit-Webhook-Id:        <task id>:<event>          the same on every retry: deduplicate on it
    Dit-Webhook-Timestamp: <unix seconds>
    Dit-Webhook-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>

A receiver recomputes the signature with the shared secret and refuses a timestamp older than a few
minutes (replay protection). Only 2xx counts as delivered; redirects are not followed. A failed call
is retried after 1, 2, 4 ... 300 s until `max_age_s` after the first attempt; every attempt is listed
on the task (`webhook_attempts`). Only hosts the operator allows (`--webhook-allow`) may be named.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from urllib.parse import urlsplit

import httpx

from protocol import FINAL_STATUSES, TaskView, WebhookAttempt
from scheduler.metrics import SchedulerMetrics
from scheduler.store import Store

log = logging.getLogger(__name__)


def refusal(url: str, allow: tuple[str, ...]) -> str | None:
    """Why `url` may not be called (None: it may). `allow` entries: host, host:port, *.domain."""
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        return f"webhook.url is not a URL: {e}"
    if parts.scheme not in ("http", "https") or not host:
        return "webhook.url must be an http(s) URL with a host"
    if not allow:
        return "webhooks are off: this scheduler allows no webhook hosts (--webhook-allow)"
    for entry in allow:
        name, _, want_port = entry.lower().partition(":")
        if want_port and want_port != str(port):
            continue
        if host == name or (name.startswith("*.") and host.endswith(name[1:])):
            return None
    return f"webhook.url: host {host}:{port} is not one this scheduler may call (--webhook-allow)"


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    return "v1=" + hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


class Dispatcher:
    def __init__(self, store: Store, secret: bytes, *, timeout_s: float = 10.0, max_age_s: float = 3600.0,
                 every_s: float = 0.5, batch: int = 32, transport: httpx.AsyncBaseTransport | None = None,
                 metrics: SchedulerMetrics | None = None) -> None:
        self._store = store
        self._metrics = metrics
        self._secret = secret
        self._max_age_s = max_age_s
        self._every_s = every_s
        self._batch = batch
        self._http = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, transport=transport)

    async def run(self) -> None:
        """Until cancelled: claim what is due, deliver it concurrently, record each attempt."""
        try:
            while True:
                try:
                    claimed = await self._store.acall(self._store.upkeep.claim_webhooks, self._batch)
                except Exception:  # the database away: try again on the next tick
                    log.exception("claiming due webhooks failed")
                    claimed = []
                if claimed:
                    await asyncio.gather(*(self._deliver(task, mark) for task, mark in claimed))
                else:
                    await asyncio.sleep(self._every_s)
        finally:
            await self._http.aclose()

    async def _deliver(self, task: TaskView, mark: float) -> None:
        event = "ended" if task.status in FINAL_STATUSES else "started"
        body = json.dumps({"event": event, "task": task.model_dump(mode="json", exclude={"webhook_attempts"})},
                          separators=(",", ":")).encode()
        stamp = int(time.time())
        headers = {"Content-Type": "application/json", "Dit-Webhook-Id": f"{task.id}:{event}",
                   "Dit-Webhook-Timestamp": str(stamp), "Dit-Webhook-Signature": sign(self._secret, stamp, body)}
        code, error = None, None
        try:
            resp = await self._http.post(task.webhook.url, content=body, headers=headers)
            code = resp.status_code
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"[:500]
        delivered = code is not None and 200 <= code < 300
        attempt = WebhookAttempt(event=event, at=time.time(), status_code=code, error=error, delivered=delivered)
        next_due = self._next_due(task, event, attempt)
        await self._store.acall(self._store.upkeep.webhook_attempted, task.id, attempt, mark, next_due)
        if self._metrics is not None:
            outcome = "delivered" if delivered else "failed" if next_due is not None else "gave_up"
            self._metrics.webhooks.labels(event, outcome).inc()

    def _next_due(self, task: TaskView, event: str, attempt: WebhookAttempt) -> float | None:
        if attempt.delivered:
            return None
        earlier = [a for a in task.webhook_attempts if a.event == event]
        first = earlier[0].at if earlier else attempt.at
        if attempt.at - first >= self._max_age_s:
            log.warning("task %s: giving up the %s webhook after %d attempts (%s)", task.id, event,
                        len(earlier) + 1, attempt.error or attempt.status_code)
            return None
        return attempt.at + min(300.0, 2.0 ** len(earlier))
