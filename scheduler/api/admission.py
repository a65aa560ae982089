"""The checks a submission passes before anything is stored: its webhooks' hosts are allowed, some
live worker can serve its input, the queue has room, and its client is under its rate."""

from __future__ import annotations

import math

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from protocol import SubmitTask
from scheduler import servable
from scheduler.api.cache import Cached
from scheduler.config import ApiConfig
from scheduler.limits import RateLimit, client_key, retry_after_s
from scheduler.metrics import SchedulerMetrics
from scheduler.store import Store
from scheduler.webhooks import refusal

PACE_MAX_AGE_S = 5  # a full queue must not cost a scan per refused request


class Admission:
    def __init__(self, store: Store, api: ApiConfig, metrics: SchedulerMetrics) -> None:
        self._store = store
        self._api = api
        self._submissions = metrics.submissions
        self._rate = RateLimit(api.rate_limit, api.rate_burst or max(1.0, api.rate_limit * 10))
        self._pace: Cached[int] = Cached(0)  # tasks ended in the last minute

    async def check(self, tasks: list[SubmitTask], request: Request) -> None:
        """422 for a webhook or an input refused, 429 (with a Retry-After) for no room or over rate."""
        self._check_webhooks(tasks)
        await self._check_servable(tasks)
        await self._admit(request, len(tasks))

    def _check_webhooks(self, tasks: list[SubmitTask]) -> None:
        """422 naming the host when a task's webhook is not on the operator's allowlist."""
        for i, task in enumerate(tasks):
            if task.webhook is not None and (why := refusal(task.webhook.url, self._api.webhook_allow)):
                raise HTTPException(422, _of(i, tasks, why))

    async def _check_servable(self, tasks: list[SubmitTask]) -> None:
        """422 naming the field when no live worker's limits allow a task's input: better now than a
        failure once leased. Nothing is refused while no live worker is registered (the fleet may
        start later), nor with --admit-unservable."""
        if self._api.admit_unservable:
            return
        fleet = await self._store.acall(self._store.workers.fleet_limits)
        for i, task in enumerate(tasks):
            if why := servable.refusal(task.input, fleet):
                self._submissions.labels("unservable").inc(len(tasks))
                raise HTTPException(422, _of(i, tasks, why))

    async def _admit(self, request: Request, n: int) -> None:
        """429 with a Retry-After when the queue is full or this client is over its rate; n tasks."""
        limit = self._api.max_queued
        queued = await self._store.acall(self._store.tasks.queued_count)
        if queued + n > limit:
            self._submissions.labels("refused").inc(n)
            retry = retry_after_s(queued + n - limit, await self._pace.get(self._ended_lately, PACE_MAX_AGE_S))
            raise HTTPException(429, f"queue is full ({queued} queued, limit {limit}); at the recent pace there "
                                f"is room in about {retry}s", headers={"Retry-After": str(retry)})
        client = client_key(request.headers.get("authorization"), request.client.host if request.client else None)
        wait = self._rate.take(client, n)
        if wait == math.inf:
            raise HTTPException(422, f"{n} tasks in one call is over this client's burst ({self._rate.burst:g}); "
                                "send fewer per call")
        if wait > 0:
            self._submissions.labels("rate_limited").inc(n)
            raise HTTPException(429, f"rate limit: {self._api.rate_limit:g} tasks/s per client", headers={
                "Retry-After": str(max(1, math.ceil(wait)))})

    async def _ended_lately(self) -> int:
        return await run_in_threadpool(self._store.tasks.ended_since, 60)  # a scan: off the event loop


def _of(i: int, tasks: list[SubmitTask], why: str) -> str:
    """A refusal's detail: which task of a batch it is about."""
    return f"tasks[{i}]: {why}" if len(tasks) > 1 else why
