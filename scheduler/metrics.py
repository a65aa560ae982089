"""The scheduler's Prometheus metrics (prometheus-client), one registry per app.

Events this process handled are counted as they happen (submissions, leases granted, reports by
status and outcome, request latency per route; held tasks taken back come from the store's own
tally). The queue's state (depth per priority, oldest queued age, running, workers by status) is read
from the database at scrape time, so every scheduler process on one database reports the same
values: aggregate those with max(), the counters with sum().
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client import PlatformCollector, ProcessCollector

from protocol import ModelFigures, RegistrationStatus, WorkerView
from scheduler.store import Store
from scheduler.store.lifecycle import CLOSED

# Long polls (lease) last up to their wait_s: the upper buckets are for them.
LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, float("inf"))
LAG_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, float("inf"))


class SchedulerMetrics:
    def __init__(self, store: Store, *, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.submissions = Counter("dit_scheduler_submissions", "Tasks submitted, by result",
                                   ["result"], registry=r)  # created, replayed (idempotency key), conflict, refused
        # (queue full), rate_limited, unservable (no live worker's limits allow the input), shed (this process busy)
        self.leases = Counter("dit_scheduler_leases_granted", "Tasks leased to workers", registry=r)
        self.leases_given_back = Counter("dit_scheduler_leases_given_back",
                                         "Tasks claimed for a long poll whose worker had gone; back in the queue",
                                         registry=r)
        self.reports = Counter("dit_scheduler_reports", "Worker reports, by status and outcome",
                               ["status", "outcome"], registry=r)  # outcome: accepted, conflict, not_found
        self.webhooks = Counter("dit_scheduler_webhooks", "Webhook calls, by event and outcome", ["event", "outcome"],
                                registry=r)  # outcome: delivered, failed (retried later), gave_up
        self.requests = Histogram("dit_scheduler_request_seconds", "Request latency by route (lease: with its wait)",
                                  ["method", "route", "code"], buckets=LATENCY_BUCKETS, registry=r)
        # Sampled four times a second (loop_watch.py); a loop stuck for server.stuck_loop_s exits.
        self.loop_lag = Histogram("dit_scheduler_event_loop_lag_seconds", "How late the event loop ran a timer "
                                  "that was due: what every call waits beyond its own work", buckets=LAG_BUCKETS,
                                  registry=r)
        r.register(QueueCollector(store))
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)

    def exposition(self) -> bytes:
        """The text format; reads the database (call it off the event loop)."""
        return generate_latest(self.registry)


class QueueCollector(Collector):
    """The queue as the database holds it, read per scrape."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        fig = self._store.tasks.figures()
        depth = GaugeMetricFamily("dit_scheduler_queue_depth", "Queued tasks, by priority", labels=["priority"])
        for priority, n in sorted(fig.queued_by_priority.items(), key=lambda kv: int(kv[0])):
            depth.add_metric([priority], n)
        yield depth
        yield GaugeMetricFamily("dit_scheduler_queued", "Queued tasks, all priorities", value=fig.queued)
        yield GaugeMetricFamily("dit_scheduler_oldest_queued_age_seconds", "Age of the oldest queued task (0: none)",
                                value=fig.oldest_queued_age_s or 0.0)
        yield GaugeMetricFamily("dit_scheduler_running", "Tasks leased or processing", value=fig.running)
        yield GaugeMetricFamily("dit_scheduler_ended_per_second", "Tasks ended per second lately, the end rate "
                                "(0: too few to tell)", value=fig.ended_per_s)
        yield GaugeMetricFamily("dit_scheduler_drain_per_second", "Deprecated, removed in the next release: "
                                "dit_scheduler_ended_per_second under its old name", value=fig.ended_per_s)
        wait = GaugeMetricFamily("dit_scheduler_queue_wait_estimate_seconds", "Seconds a task submitted now would "
                                 "wait at the end rate, by priority (submissions are refused "
                                 "beyond api.gate.max_queue_wait_s)", labels=["priority"])
        for priority, seconds in sorted(fig.wait_s_by_priority.items(), key=lambda kv: int(kv[0])):
            wait.add_metric([priority], seconds)
        yield wait
        workers = GaugeMetricFamily("dit_scheduler_workers", "Worker registrations, by status", labels=["status"])
        for status in RegistrationStatus:
            workers.add_metric([status], fig.workers_by_status.get(status, 0))
        yield workers
        yield from _per_model(fig.models)
        reclaimed = CounterMetricFamily("dit_scheduler_leases_reclaimed",
                                        "Held tasks taken back from workers (this process), by reason and result",
                                        labels=["reason", "result"])
        for (reason, result), n in sorted(self._store.reclaimed.copy().items()):  # the loop adds to it meanwhile
            reclaimed.add_metric([reason, result], n)
        yield reclaimed


def _per_model(models: dict[str, ModelFigures]) -> Iterator[Metric]:
    """The autoscaling signal per model of the fleet (none on a fleet of one model)."""
    queued = GaugeMetricFamily("dit_scheduler_model_queued", "Queued tasks, by model", labels=["model"])
    oldest = GaugeMetricFamily("dit_scheduler_model_oldest_queued_age_seconds",
                               "Age of the oldest queued task of each model (0: none)", labels=["model"])
    running = GaugeMetricFamily("dit_scheduler_model_running", "Tasks leased or processing, by model", labels=["model"])
    workers = GaugeMetricFamily("dit_scheduler_model_workers", "Live workers by model: holding it resident (warm) "
                                "or able to load it (loadable)", labels=["model", "state"])
    for model, fig in models.items():
        queued.add_metric([model], fig.queued)
        oldest.add_metric([model], fig.oldest_queued_age_s or 0.0)
        running.add_metric([model], fig.running)
        workers.add_metric([model, "warm"], fig.warm_workers)
        workers.add_metric([model, "loadable"], fig.loadable_workers)
    yield from (queued, oldest, running, workers)


class RequestTimer:
    """ASGI middleware: each request's latency by method, route template and status code."""

    def __init__(self, app, metrics: SchedulerMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], Any] = {}  # by method, route template, status

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        code = {"value": 500}

        async def seen(message) -> None:
            if message["type"] == "http.response.start":
                code["value"] = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, seen)
        finally:
            key = (scope["method"], getattr(scope.get("route"), "path", "unmatched"), code["value"])
            if (child := self._children.get(key)) is None:  # labels() costs more than the observe
                child = self._children[key] = self.metrics.requests.labels(*key[:2], str(key[2]))
            child.observe(time.perf_counter() - t0)


def prometheus_targets(workers: list[WorkerView]) -> list[dict]:
    """Prometheus HTTP service discovery (http_sd_configs): every live worker's /metrics."""
    out = []
    for w in workers:
        if w.ops_url and w.status not in CLOSED:
            out.append({"targets": [w.ops_url.split("://", 1)[1].rstrip("/")],
                        "labels": {"worker_id": w.id, "hostname": w.hostname, "node_id": w.node_id or "",
                                   "__scheme__": w.ops_url.split("://", 1)[0]}})
    return out
