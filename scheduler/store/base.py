"""What every store backend shares: the interface the HTTP app calls (one Protocol per role, and the
Store that holds them), its errors, and the views built from a task or worker row (both backends
keep the same columns, JSON held as text)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from protocol import (
    Heartbeat,
    HeartbeatReply,
    Lease,
    ModelFigures,
    QueueFigures,
    RegisterWorker,
    Report,
    SubmitTask,
    TaskView,
    WebhookAttempt,
    WorkerLimits,
    WorkerModels,
    WorkerView,
    stored,
)


class Moved(NamedTuple):
    """A report's accepted outcome where its caller reads no more than the task's new status (an
    exchange's): no view built, which is a tenth of such a call's CPU."""
    task_id: str
    status: str


class Unknown(Exception):
    """No such task or worker (a worker that drained is unknown too: it registers again). HTTP 404."""


class Refused(Exception):
    """Idempotency-key reuse with another body, or a report whose lease is not current (stale). HTTP 409."""


class Cancelled(Refused):
    """A report on a task a client cancelled: refused, and the task is now `cancelled`."""


class Tasks(Protocol):
    """Submits and reads."""

    def submit(self, req: SubmitTask) -> tuple[TaskView, bool]:
        """(task, created). A repeated idempotency key returns the first task."""

    async def asubmit(self, req: SubmitTask) -> tuple[TaskView, bool]:
        """submit, from the event loop."""

    def submit_many(self, reqs: list[SubmitTask]) -> list[tuple[TaskView, bool]]:
        """All in one transaction, or none."""

    def get(self, task_id: str) -> TaskView: ...

    def list(self, status: str | None, limit: int, offset: int) -> list[TaskView]: ...

    def ended_among(self, task_ids: list[str]) -> list[str]:
        """Those of `task_ids` in a final state."""

    def ended_since(self, window_s: float) -> int:
        """Tasks that ended within the last `window_s`."""

    def queued_count(self) -> int: ...

    def queued_by_priority(self) -> dict[int, int]: ...

    def end_rate(self, window_s: float = ...) -> float:
        """Tasks ended per second lately (the end rate); 0 when too few ended to tell."""

    def figures(self) -> QueueFigures: ...

    def models(self) -> dict[str, ModelFigures]:
        """Per model of the fleet: queued, oldest wait, running, warm and loadable live workers."""

    def recent(self, status: str, window_s: float, limit: int) -> list[TaskView]:
        """Tasks that ended in `status` within the last `window_s`, newest first."""

    def history(self, window_s: float, bucket_s: int) -> list[dict]:
        """Rows of (bucket, status, n, mean_s, max_s): tasks ended per time bucket in the window."""


class Workers(Protocol):
    """Registrations and heartbeats."""

    def register(self, req: RegisterWorker) -> tuple[str, int]:
        """(worker id, tasks requeued from the node's earlier registrations)."""

    def heartbeat(self, worker_id: str, hb: Heartbeat) -> HeartbeatReply: ...

    def known(self, worker_id: str) -> None:
        """Unknown unless the worker is registered and has not drained."""

    def workers(self) -> list[WorkerView]: ...

    def fleet_limits(self) -> list[WorkerLimits | None]:
        """The distinct limits of the workers that can take tasks (initializing, ready); None for
        one that advertised none. Empty when there is no such worker."""


class Claims(Protocol):
    """Claims and leases."""

    def claim(self, worker_id: str, max_tasks: int, resident: list[str] | None = None,
              claim_id: str | None = None, adapters: list[str] | None = None) -> list[Lease]:
        """Atomically lease up to `max_tasks` queued tasks, highest priority first, then FIFO; on a
        fleet of several models, of one model, routed (routing.py). `resident`: the models the
        worker holds now, when its lease says. `claim_id`: the exchange claiming, recorded on each.
        `adapters`: the sets of adapters it holds loaded now, when its lease says (claims.py)."""

    async def aclaim(self, worker_id: str, max_tasks: int, resident: list[str] | None = None,
                     claim_id: str | None = None, adapters: list[str] | None = None) -> list[Lease]: ...

    def claimed(self, worker_id: str, claim_id: str) -> list[Lease]:
        """The leases claimed under `claim_id` (an exchange's id) that the worker holds unstarted."""

    def cancelled_among(self, worker_id: str, task_ids: list[str]) -> list[str]:
        """Which of the tasks the worker holds a client cancelled."""

    async def acancelled_among(self, worker_id: str, task_ids: list[str]) -> list[str]: ...


class Reports(Protocol):
    """Reports and outcomes."""

    def report(self, task_id: str, rep: Report) -> TaskView: ...

    async def areport(self, task_id: str, rep: Report) -> TaskView: ...

    def report_many(self, items: list[tuple[str, Report]], views: bool = True) -> list[TaskView | Moved | Unknown | Refused]:
        """Each report applied on its own, atomically, in order; a refused one returned as its error;
        an accepted one as the task's view, or (not `views`) as what it moved the task to."""

    async def areport_many(self, items: list[tuple[str, Report]],
                           views: bool = True) -> list[TaskView | Moved | Unknown | Refused]: ...

    def cancel(self, task_id: str) -> TaskView:
        """Queued: `cancelled` at once. Leased or processing: marked (cancel_requested_at); its
        worker learns it from the heartbeat reply and any later report ends it `cancelled`; its lease
        expiring does too. Refused when the task has already ended."""


class Upkeep(Protocol):
    """Maintenance: sweeps, retention, webhooks. Never inside a request."""

    def sweep(self) -> int:
        """Requeues (or fails) tasks whose lease expired; the number of tasks it moved."""

    def purge(self, limit: int = 5000) -> list[str]:
        """Removes ended tasks past their retention (`expires_at`); the result URIs they held."""

    def claim_webhooks(self, limit: int, hold_s: float = 60.0) -> list[tuple[TaskView, float]]:
        """Tasks with a webhook event due, held for `hold_s`: (task, claim mark)."""

    def webhook_attempted(self, task_id: str, attempt: "WebhookAttempt", mark: float, next_due: float | None) -> None:
        """Records a delivery attempt; `next_due` None when delivered or given up."""


class Store(Protocol):
    """The scheduler's state, by role. Every state change is atomic; reads never block writers."""

    lease_ttl_s: float
    max_attempts: int
    models: frozenset[str]  # the fleet's models; empty: one model, tasks name none
    default_model: str | None  # the model of a task that names none
    cold_wait_s: float
    adapter_wait_s: float  # a task of a set of adapters a live worker holds is its alone this long
    location: str  # the file or URL it was opened on
    inline: bool  # calls are in-process and short: the app makes them on its event loop
    # Held tasks this process took back (expired lease, lost or restarted worker), by (reason code,
    # "queued", "failed" or "cancelled"); a tally for /metrics.
    reclaimed: Counter[tuple[str, str]]
    tasks: Tasks
    workers: Workers
    claims: Claims
    reports: Reports
    upkeep: Upkeep

    def ping(self) -> None:
        """One round trip to the database; raises when it cannot be reached."""

    def close(self) -> None: ...

    # The request path's hot calls, for the app's event loop: the same rules, without a thread
    # where the backend allows it. aopen() first, on that loop; aclose() at the end.
    async def aopen(self) -> None: ...

    async def aclose(self) -> None: ...

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Any of the roles' blocking calls, from the event loop (on it, or on a thread)."""


def task_view(row: Mapping[str, Any], retention_s: float | None = None) -> TaskView:
    return stored(TaskView, dict(
        id=row["id"], status=row["status"], input=json.loads(row["input"]), model=row["model"], priority=row["priority"],
        attempts=row["attempts"], max_attempts=row["max_attempts"],
        idempotency_key=row["idempotency_key"], worker_id=row["worker_id"],
        result=json.loads(row["result"]) if row["result"] else None,
        error=json.loads(row["error"]) if row["error"] else None,
        created_at=row["created_at"], updated_at=row["updated_at"],
        started_at=row["started_at"], finished_at=row["finished_at"],
        cancel_requested_at=row["cancel_requested_at"],
        expires_at=row["finished_at"] + retention_s if row["finished_at"] is not None and retention_s else None,
        webhook=json.loads(row["webhook"]) if row["webhook"] else None,
        webhook_attempts=json.loads(row["webhook_attempts"] or "[]"),
    ))


def worker_view(row: Mapping[str, Any], now: float, models: WorkerModels | None = None,
                adapters: list[str] | None = None) -> WorkerView:
    info = json.loads(row["info"])
    info.pop("models", None)  # kept in worker_models, where leases and heartbeats change it
    beat = row["last_heartbeat"]
    limits = json.loads(row["limits"]) if row["limits"] else None
    return WorkerView(id=row["id"], status=row["status"], node_id=row["node_id"], in_flight=json.loads(row["in_flight"]),
                      limits=limits, models=models, adapters=adapters or [],
                      warnings=json.loads(row["warnings"]), counters=json.loads(row["counters"]),
                      safety_policy=row["safety_policy"],
                      registered_at=row["registered_at"], last_heartbeat=beat,
                      last_heartbeat_age_s=None if beat is None else round(now - beat, 3), **info)
