"""The reference scheduler's HTTP API (FastAPI). See docs/protocol.md for the protocol in prose; the
routes, by resource, are in scheduler/api/."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from starlette.types import ASGIApp

from scheduler.api import background, errors, ops, reports, status, tasks, workers
from scheduler.api.body_limit import BodyLimit
from scheduler.api.hot import HotPath
from scheduler.api.deps import SERVICES
from scheduler.api.services import Services
from scheduler.config import ApiConfig, Secrets
from scheduler.metrics import RequestTimer, SchedulerMetrics
from scheduler.store import Store
from scheduler.waiting import Stop

ROUTERS = (tasks.router, workers.router, reports.router, ops.router, status.router)


def create_app(store: Store, api: ApiConfig = ApiConfig(), secrets: Secrets = Secrets(), *,
               metrics: SchedulerMetrics | None = None, stop: Stop | None = None) -> FastAPI:
    """The app over `store`, with the settings' api section and the secrets it names. Empty token
    sets switch auth off; __main__ allows that only on a loopback address. `metrics`: made here when
    not given (the process's server also records into them); `stop`, fired on the loop as the process
    stops: every waiting call is answered then (scheduler/server.py)."""
    metrics = metrics or SchedulerMetrics(store)  # before the lifespan: the request timer needs it

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Services]]:
        await store.aopen()
        services = Services.make(store, api, secrets, metrics)
        if stop is not None:
            stop.listen(services.stop_waiting)
        async with background.running(services):
            yield {SERVICES: services}  # each request's state: the dependencies read it there
        await services.watch.close()
        await store.aclose()

    app = _App(title="dit-worker reference scheduler", version="1", lifespan=lifespan, **_no_telemetry())
    app.outer = lambda inner: RequestTimer(BodyLimit(HotPath(inner, fastapi=app) if api.hot_path else inner,
                                                     max_bytes=api.max_body_bytes), metrics=metrics)
    errors.install(app)
    for router in ROUTERS:
        # The routers' routes, not the routers: FastAPI (0.165) walks an included router anew on
        # every request, some 40 us more per call, leases and reports too. (app.dependency_overrides
        # do not reach these routes; tests give the app a store of their own instead.)
        app.router.routes.extend(router.routes)
    return app


class _App(FastAPI):
    """FastAPI with the scheduler's own middleware outside FastAPI's: the request timer (outermost: a
    413 is timed too), the body limit, then the hot path (timed and body-limited like any call). The
    calls it serves skip FastAPI's own layers (its error, telemetry and body-limit middleware: some
    5% of a hot call's CPU); whatever it hands on goes through them as before. An error nothing
    handles is a 500 either way: FastAPI's ServerErrorMiddleware sends it for the routes, uvicorn for
    the hot path."""

    outer: Callable[[ASGIApp], ASGIApp] = staticmethod(lambda inner: inner)

    def build_middleware_stack(self) -> ASGIApp:
        return self.outer(super().build_middleware_stack())


def _no_telemetry() -> dict:
    """FastAPI 0.16x asks OpenTelemetry on every request whether a tracer, meter or logger provider
    is configured (a few percent of the scheduler's time under a fleet's load). The scheduler's
    figures are its Prometheus metrics, so its native telemetry is off; older FastAPI has none."""
    if "telemetry" not in inspect.signature(FastAPI).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
