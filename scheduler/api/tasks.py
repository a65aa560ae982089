"""Clients' routes: submit (one, or a batch in one transaction), read with an optional wait, cancel,
list, and the queue's figures."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from protocol import (
    FINAL_STATUSES,
    ModelsView,
    QueueFigures,
    SubmitBatch,
    SubmitTask,
    SubmittedBatch,
    TaskList,
    TaskStatus,
    TaskView,
)
from scheduler.api.answer import Answer
from scheduler.api.auth import client_auth
from scheduler.api.deps import (
    GateDep,
    ServicesDep,
    ApiDep,
    MetricsDep,
    ReportsDep,
    StoreDep,
    StoreCall,
    TasksDep,
    WaitersDep,
    WatchDep,
)
from scheduler.api.services import Services
from scheduler.store import Refused, Store
from scheduler.waiting import Waiters

router = APIRouter(tags=["clients"], dependencies=[Depends(client_auth)])


@router.post("/v1/tasks", status_code=201, response_model=TaskView,
             responses={200: {"description": "idempotent replay"}, 409: {}, 429: {}})
async def submit(body: SubmitTask, request: Request, svc: ServicesDep,
                 prefer: str | None = Header(None, description="`wait=N`: answer once the task ends, "
                                             "or after N seconds (capped) with the task as it stands")) -> Response:
    return (await submit_one(svc, body, request, prefer)).response()


async def submit_one(svc: Services, body: SubmitTask, request: Request, prefer: str | None) -> Answer:
    """201 and the task; 200 for an idempotent replay; with `Prefer: wait=N`, once it ends or N passed."""
    with svc.gate.taking(1):
        await svc.gate.check([body], request)
        try:
            task, created = await svc.store.tasks.asubmit(body)
        except Refused:
            svc.metrics.submissions.labels("conflict").inc()
            raise
    svc.metrics.submissions.labels("created" if created else "replayed").inc()
    if created:
        _wake(svc.waiters, svc.store, 1, int(bool(body.input.get("loras"))))
    headers: tuple[tuple[str, str], ...] = ()
    if (wait_s := _preferred_wait(prefer, svc.api.waits.max_s)) is not None:
        headers = (("Preference-Applied", f"wait={wait_s:g}"),)
        task = await svc.watch.until_ended(task, wait_s)
    return Answer.of(task, 201 if created else 200, headers)


@router.post("/v1/tasks/batch", status_code=201, response_model=SubmittedBatch, responses={409: {}, 429: {}})
async def submit_batch(body: SubmitBatch, request: Request, tasks: TasksDep, call: StoreCall, gate: GateDep,
                       metrics: MetricsDep, waiters: WaitersDep, store: StoreDep) -> SubmittedBatch:
    """Many tasks in one call and one transaction: all are stored, or none."""
    with gate.taking(len(body.tasks)):
        await gate.check(body.tasks, request)
        try:
            out = await call(tasks.submit_many, body.tasks)
        except Refused:
            metrics.submissions.labels("conflict").inc(len(body.tasks))
            raise
    created = sum(c for _, c in out)
    metrics.submissions.labels("created").inc(created)
    metrics.submissions.labels("replayed").inc(len(out) - created)
    _wake(waiters, store, created, sum(c and bool(t.input.get("loras")) for t, (_, c) in zip(body.tasks, out)))
    return SubmittedBatch(tasks=[t for t, _ in out], created=[c for _, c in out])


def _wake(waiters: Waiters, store: Store, created: int, with_adapters: int) -> None:
    """New tasks wake as many waiting leases; each of those with adapters wakes one more when its
    adapters' holder has had it to itself for adapter_wait_s (store/claims.py) and anyone may take it."""
    waiters.notify(created)
    if with_adapters and store.adapter_wait_s > 0:
        waiters.notify_later(store.adapter_wait_s, with_adapters)


@router.get("/v1/queue", response_model=QueueFigures)
async def queue_figures(tasks: TasksDep) -> QueueFigures:
    """Depth per priority, the oldest queued task's age, tasks ended in the last 1, 5 and 15
    minutes, workers by status: for autoscalers and dashboards."""
    return await run_in_threadpool(tasks.figures)  # may scan: never on the event loop


@router.get("/v1/models", response_model=ModelsView)
async def models(tasks: TasksDep, store: StoreDep) -> ModelsView:
    """The fleet's models (the scheduler's [models]) with each one's queue and workers: the
    autoscaling signal per model. Empty on a fleet of one model."""
    return ModelsView(default=store.default_model, cold_wait_s=store.cold_wait_s,
                      models=await run_in_threadpool(tasks.models))  # scans the queue: off the event loop


@router.get("/v1/tasks/{task_id}", response_model=TaskView, responses={404: {}})
async def get_task(task_id: str, tasks: TasksDep, call: StoreCall, watch: WatchDep, api: ApiDep,
                   wait_s: float = Query(0, ge=0, le=3600, description=(
                       "long poll: answer once the task ends, or after this many seconds (capped by the "
                       "scheduler)"))) -> TaskView:
    task = await call(tasks.get, task_id)
    return await watch.until_ended(task, min(wait_s, api.waits.max_s))


@router.post("/v1/tasks/{task_id}/cancel", response_model=TaskView,
             responses={404: {}, 409: {"description": "already ended"}})
async def cancel(task_id: str, reports: ReportsDep, call: StoreCall, watch: WatchDep) -> TaskView:
    """A queued task ends `cancelled` at once. A leased or processing one is marked
    (`cancel_requested_at`): its worker drops it or discards its result, and it ends `cancelled`,
    never `succeeded`. A task that has ended answers 409 and does not change."""
    task = await call(reports.cancel, task_id)
    if task.status in FINAL_STATUSES:
        watch.ended([task_id])
    return task


@router.get("/v1/tasks", response_model=TaskList)
async def list_tasks(tasks: TasksDep, status: TaskStatus | None = None, limit: int = Query(100, ge=1, le=1000),
                     offset: int = Query(0, ge=0, le=1_000_000_000)) -> TaskList:
    return TaskList(tasks=await run_in_threadpool(tasks.list, status, limit, offset))


_WAIT = re.compile(r'(?:^|[,;\s])wait\s*=\s*"?(\d+(?:\.\d+)?)"?', re.IGNORECASE)


def _preferred_wait(prefer: str | None, cap_s: float) -> float | None:
    """`Prefer: wait=N` (RFC 7240), capped; None when the header asks for no wait."""
    if not prefer or not (m := _WAIT.search(prefer)):
        return None
    return min(float(m.group(1)), cap_s)
