"""HTTP client for the queue protocol (docs/protocol.md). Used on rank 0 only.

Every call has a timeout, and every status code the protocol uses is mapped to one outcome:
  200/201 -> parsed body; 204 -> nothing to do; 401/403 -> AuthError (fatal);
  404 -> NotFound; 409 -> LeaseLost (or idempotency conflict); 400/422 -> QueueError (a bug: not retried);
  429 -> Unavailable honouring Retry-After; 5xx and transport errors -> Unavailable (retried).
Messages and retry logs name the scheduler's URL: the first thing to check when it does not answer.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from tenacity import (RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, stop_when_event_set,
                      wait_random_exponential)
from tenacity.wait import wait_base

from protocol import (Exchange, Exchanged, Heartbeat, HeartbeatReply, Lease, LeaseRequest, LeaseResponse, Registered, RegisterWorker,
                      Report, ReportBatch, ReportOutcome, ReportOutcomes, TaskReport, TaskView)
from worker.config import QueueConfig

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class QueueError(Exception):
    pass


class AuthError(QueueError):
    pass


class NotFound(QueueError):
    pass


class LeaseLost(QueueError):
    """409: the task's lease belongs to a newer attempt; this worker's result must not be reported."""


class Unavailable(QueueError):
    """429, 5xx or a transport error: worth retrying, after `retry_after` seconds if the server said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Interrupted(QueueError):
    """The caller's stop event was set while a call was being retried (a stop signal at start-up)."""


def backoff(inner: wait_base, max_s: float):
    """Waits as `inner` does, unless the scheduler said how long (a 429's Retry-After), capped at max_s."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Unavailable) and exc.retry_after is not None:
            return min(exc.retry_after, max_s)
        return inner(state)

    return wait


class QueueClient:
    def __init__(self, cfg: QueueConfig, token: str | None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._cfg = cfg
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=cfg.url, headers=headers, timeout=cfg.timeout_s,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------ protocol calls

    def register(self, info: RegisterWorker, deadline_s: float,
                 interrupt: threading.Event | None = None) -> Registered:
        """Retried until `deadline_s`; Interrupted as soon as `interrupt` is set."""
        return self._retrying(deadline_s, self._call, "POST", "/v1/workers", info, Registered, interrupt=interrupt)

    def lease(self, worker_id: str, max_tasks: int, wait_s: float, resident: list[str] | None = None,
              adapters: list[str] | None = None) -> list[Lease]:
        """One long-poll; not retried here, because the serve loop must get back to its peers.
        `resident`: the models it holds now, for a scheduler routing several; `adapters`: the sets
        of adapters it holds loaded."""
        body = LeaseRequest(max_tasks=max_tasks, wait_s=wait_s, resident=resident, adapters=adapters)
        # The server may hold the request for wait_s before answering 204.
        resp = self._call("POST", f"/v1/workers/{worker_id}/lease", body, LeaseResponse,
                          timeout=self._cfg.timeout_s + wait_s)
        return resp.leases if resp else []

    def heartbeat(self, worker_id: str, hb: Heartbeat, deadline_s: float,
                  interrupt: threading.Event | None = None) -> HeartbeatReply:
        """Retried until `deadline_s`; Interrupted as soon as `interrupt` is set."""
        return self._retrying(deadline_s, self._call, "POST", f"/v1/workers/{worker_id}/heartbeat",
                              hb, HeartbeatReply, interrupt=interrupt)

    def report(self, task_id: str, rep: Report, deadline_s: float) -> TaskView:
        return self._retrying(deadline_s, self._call, "POST", f"/v1/tasks/{task_id}/report", rep,
                              TaskView)

    def report_many(self, reports: list[TaskReport], deadline_s: float) -> list[ReportOutcome]:
        """Several reports in one call; each outcome carries the status code its own call would have
        had. NotFound: the scheduler has no POST /v1/reports (an older one)."""
        return self._retrying(deadline_s, self._call, "POST", "/v1/reports", ReportBatch(reports=reports),
                              ReportOutcomes).results

    def exchange(self, worker_id: str, body: Exchange, deadline_s: float) -> Exchanged:
        """One exchange (reports, then new tasks), retried until `deadline_s` as the same exchange:
        each retry is marked so, and is answered the tasks its first try claimed, never more.
        NotFound: the scheduler does not know this worker, or has no exchange (an older one:
        `no_exchange(e)` tells)."""
        sent = [body]

        def once() -> Exchanged:
            out = self._call("POST", f"/v1/workers/{worker_id}/exchange", sent[0], Exchanged,
                             timeout=self._cfg.timeout_s + sent[0].wait_s)
            return out

        def marked(state: RetryCallState) -> None:
            sent[0] = sent[0].model_copy(update={"retry": True})
            self._retry_log(deadline_s)(state)

        return self._retrying(deadline_s, once, before_sleep=marked)

    # ------------------------------------------------------------ plumbing

    def _retrying(self, deadline_s: float, fn, *args: Any, interrupt: threading.Event | None = None,
                  before_sleep=None) -> Any:
        max_s = max(1.0, deadline_s / 4)
        stop = stop_after_delay(deadline_s)
        if interrupt is not None:
            stop = stop | stop_when_event_set(interrupt)
        retry = Retrying(
            retry=retry_if_exception_type(Unavailable),
            # Exponential backoff with full jitter, so workers do not return in step after an outage.
            wait=backoff(wait_random_exponential(multiplier=0.5, max=max_s), max_s),
            stop=stop,
            sleep=_sleep_unless(interrupt) if interrupt is not None else time.sleep,
            before_sleep=before_sleep or self._retry_log(deadline_s),
            reraise=True,
        )
        try:
            return retry(fn, *args)
        except Unavailable as e:
            if interrupt is not None and interrupt.is_set():
                raise Interrupted(f"stopped while retrying: {e}") from None
            raise

    def _retry_log(self, deadline_s: float):
        def log_retry(state: RetryCallState) -> None:
            log.warning("the scheduler at %s did not answer (%s); retry %d in %.1fs, giving up after %.0fs",
                        self._cfg.url, state.outcome.exception(), state.attempt_number,
                        state.upcoming_sleep, deadline_s)
        return log_retry

    def _call(self, method: str, path: str, body: BaseModel, out: type[M],
              timeout: float | None = None) -> M | None:
        try:
            resp = self._http.request(method, path, content=body.model_dump_json(),
                                      headers={"Content-Type": "application/json"},
                                      timeout=timeout or self._cfg.timeout_s)
        except httpx.TransportError as e:  # connect, read timeouts, resets
            raise Unavailable(f"{method} {self._http.base_url.join(path)}: {type(e).__name__}: {e}") from e
        return _parse(resp, out)


def no_exchange(e: NotFound) -> bool:
    """A 404 from a scheduler without POST /v1/workers/{wid}/exchange (its router's own "Not Found"),
    not one that does not know this worker (which names it)."""
    return str(e).endswith(": Not Found")


def _sleep_unless(event: threading.Event):
    """A retry's wait that ends early once `event` is set. In short slices rather than event.wait:
    the event is set by a signal handler on this same thread, which must not find the event's lock
    held by the wait it interrupted."""
    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not event.is_set() and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.25))
    return sleep


def _parse(resp: httpx.Response, out: type[M]) -> M | None:
    code, where = resp.status_code, f"{resp.request.method} {resp.request.url}"
    if code in (200, 201):
        return out.model_validate_json(resp.content)
    if code == 204:
        return None
    detail = _detail(resp)
    if code in (401, 403):
        raise AuthError(f"{where}: {code} {detail} (check queue.token_env)")
    if code == 404:
        raise NotFound(f"{where}: {detail}")
    if code == 409:
        raise LeaseLost(f"{where}: {detail}")
    if code in (400, 422):  # the scheduler refused the request's shape: the same body cannot succeed
        raise QueueError(f"{where}: {code} {detail}")
    if code == 429 or code >= 500:
        raise Unavailable(f"{where}: {code} {detail}", _retry_after(resp))
    raise QueueError(f"{where}: unexpected status {code} {detail}")


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP-date; rare from schedulers, fall back to our own backoff
        return None


def _detail(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("detail", resp.text))[:500]
    except ValueError:
        return resp.text[:500]

