"""What the routes use, in one typed container made once per run of the app (its lifespan). Routes
never see the container: each declares the one service or store role it uses (deps.py)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.api.gate import SubmitGate
from scheduler.api.cache import Cached
from scheduler.config import ApiConfig, Secrets
from scheduler.metrics import SchedulerMetrics
from scheduler.store import Store
from scheduler.waiting import TaskWatch, Waiters


@dataclass(frozen=True)
class Services:
    store: Store
    api: ApiConfig
    secrets: Secrets
    metrics: SchedulerMetrics
    waiters: Waiters  # lease requests waiting for work
    watch: TaskWatch  # clients waiting for tasks to end
    gate: SubmitGate  # the queue's room and each client's rate
    # The status page's reads scan the last hour (about 1 s at a million tasks an hour on SQLite):
    # one gather serves every viewer for `status_cache_s`, however many browsers refresh.
    status_page: Cached[str]

    @classmethod
    def make(cls, store: Store, api: ApiConfig, secrets: Secrets, metrics: SchedulerMetrics) -> Services:
        """On the event loop that serves the app."""
        return cls(store, api, secrets, metrics, Waiters(api.waits.lease_poll_s),
                   TaskWatch(store, api.waits.task_poll_s), SubmitGate(store, api, metrics), Cached(""))

    def stop_waiting(self) -> None:
        """The process is stopping: waiting lease requests and clients are answered now."""
        self.waiters.stop()
        self.watch.stop()
