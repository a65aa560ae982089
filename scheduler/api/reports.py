"""Workers' reports on their tasks: one per call, or several in one call, each applied on its own."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from protocol import FINAL_STATUSES, Report, ReportBatch, ReportOutcome, ReportOutcomes, TaskReport, TaskView
from scheduler.api.answer import Answer
from scheduler.api.auth import worker_auth
from scheduler.api.deps import ServicesDep
from scheduler.api.errors import status_of
from scheduler.api.services import Services
from scheduler.store import Cancelled, Moved, Refused, Unknown

router = APIRouter(tags=["workers"], dependencies=[Depends(worker_auth)])


@router.post("/v1/reports", response_model=ReportOutcomes)
async def report_batch(body: ReportBatch, svc: ServicesDep) -> Response:
    """Several tasks' reports in one call, each applied on its own and atomically: the
    answer holds, per report, the status code its single call would have had."""
    return (await report_many(svc, body)).response()


async def report_many(svc: Services, body: ReportBatch) -> Answer:
    """The outcome of each report, in the order given."""
    return Answer.of(ReportOutcomes(results=await applied(svc, body.reports)))


async def applied(svc: Services, reports: list[TaskReport], with_tasks: bool = True) -> list[ReportOutcome]:
    """Each report applied on its own, atomically, in order, counted and announced; its outcome
    (with the task as the report left it, unless not `with_tasks`)."""
    metrics, waiters, watch = svc.metrics, svc.waiters, svc.watch
    items = [(r.task_id, r) for r in reports]  # a TaskReport is the Report it carries: not validated again
    outcomes = await svc.store.reports.areport_many(items, views=with_tasks)
    results = []
    for (task_id, rep), out in zip(items, outcomes):
        metrics.reports.labels(rep.status, _outcome(out)).inc()
        if isinstance(out, Exception):
            results.append(ReportOutcome(task_id=task_id, status_code=status_of(out), detail=str(out)))
        else:
            results.append(ReportOutcome(task_id=task_id, status_code=200, task=out if with_tasks else None))
    if requeued := sum(not isinstance(out, Exception) and out.status == "queued" for out in outcomes):
        waiters.notify(requeued)
    watch.ended(task_id for (task_id, _), out in zip(items, outcomes) if _ended(out))
    return results


@router.post("/v1/tasks/{task_id}/report", response_model=TaskView,
             responses={404: {}, 409: {"description": "stale lease token"}})
async def report(task_id: str, body: Report, svc: ServicesDep) -> Response:
    return (await report_one(svc, task_id, body)).response()


async def report_one(svc: Services, task_id: str, body: Report) -> Answer:
    """The task as the report left it; 404 or 409 (the store's errors) when refused."""
    metrics, waiters, watch = svc.metrics, svc.waiters, svc.watch
    try:
        task = await svc.store.reports.areport(task_id, body)
    except (Unknown, Refused) as e:  # counted here, answered by the app's handler (errors.py)
        metrics.reports.labels(body.status, _outcome(e)).inc()
        if _ended(e):
            watch.ended([task_id])
        raise
    metrics.reports.labels(body.status, "accepted").inc()
    if _ended(task):
        watch.ended([task_id])
    if task.status == "queued":  # a retryable failure or a release went back to the queue
        waiters.notify(1)
    return Answer.of(task)


def _ended(out: object) -> bool:
    """A report's outcome that ended its task (accepted final, or refused because cancelled)."""
    return isinstance(out, Cancelled) or (isinstance(out, (TaskView, Moved)) and out.status in FINAL_STATUSES)


def _outcome(out: object) -> str:
    """The metric's outcome label."""
    if isinstance(out, Cancelled):
        return "cancelled"
    return "not_found" if isinstance(out, Unknown) else "conflict" if isinstance(out, Refused) else "accepted"
