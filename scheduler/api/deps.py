"""Typed dependencies: each route declares the store role or service it uses, e.g.
`reports: ReportsDep`, and FastAPI hands it over from the app's Services (services_of: the one
place that finds them, for these and the auth checks). Each is `async def` (none costs a thread)
and reads the request itself rather than depending on another dependency: FastAPI solves each
dependency of each request anew, some 15 microseconds apiece, on the lease and report paths too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from scheduler.api.gate import SubmitGate
from scheduler.api.cache import Cached
from scheduler.api.services import Services
from scheduler.config import ApiConfig
from scheduler.metrics import SchedulerMetrics
from scheduler.store import Claims, Reports, Store, Tasks, Workers
from scheduler.waiting import TaskWatch, Waiters

SERVICES = "services"  # the key of the lifespan's state that holds them
AsyncCall = Callable[..., Awaitable[Any]]


def services_of(request: Request) -> Services:
    return getattr(request.state, SERVICES)


async def services(request: Request) -> Services:
    """All of them as one dependency, for the routes a fleet calls per task (submit, lease,
    heartbeat, reports): FastAPI's per-request cost grows with each dependency it solves."""
    return services_of(request)


async def store_of(request: Request) -> Store:
    return services_of(request).store


async def store_call(request: Request) -> AsyncCall:
    """Store.acall: a role's blocking call, made from the event loop."""
    return services_of(request).store.acall


async def tasks_role(request: Request) -> Tasks:
    return services_of(request).store.tasks


async def workers_role(request: Request) -> Workers:
    return services_of(request).store.workers


async def claims_role(request: Request) -> Claims:
    return services_of(request).store.claims


async def reports_role(request: Request) -> Reports:
    return services_of(request).store.reports


async def api_settings(request: Request) -> ApiConfig:
    return services_of(request).api


async def metrics_of(request: Request) -> SchedulerMetrics:
    return services_of(request).metrics


async def waiters_of(request: Request) -> Waiters:
    return services_of(request).waiters


async def watch_of(request: Request) -> TaskWatch:
    return services_of(request).watch


async def gate_of(request: Request) -> SubmitGate:
    return services_of(request).gate


async def status_page_of(request: Request) -> Cached[str]:
    return services_of(request).status_page


ServicesDep = Annotated[Services, Depends(services)]
StoreDep = Annotated[Store, Depends(store_of)]
StoreCall = Annotated[AsyncCall, Depends(store_call)]
TasksDep = Annotated[Tasks, Depends(tasks_role)]
WorkersDep = Annotated[Workers, Depends(workers_role)]
ClaimsDep = Annotated[Claims, Depends(claims_role)]
ReportsDep = Annotated[Reports, Depends(reports_role)]
ApiDep = Annotated[ApiConfig, Depends(api_settings)]
MetricsDep = Annotated[SchedulerMetrics, Depends(metrics_of)]
WaitersDep = Annotated[Waiters, Depends(waiters_of)]
WatchDep = Annotated[TaskWatch, Depends(watch_of)]
GateDep = Annotated[SubmitGate, Depends(gate_of)]
StatusPageDep = Annotated[Cached[str], Depends(status_page_of)]
