"""For load balancers, orchestrators and Prometheus; no auth (nothing here is a secret)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from scheduler.api.deps import ApiDep, MetricsDep, StoreDep

router = APIRouter(tags=["ops"])


@router.get("/livez")
@router.get("/healthz")
async def livez() -> dict[str, str]:
    """The process answers: its event loop turns."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database unreachable"}})
async def readyz(store: StoreDep, api: ApiDep) -> JSONResponse:
    """Ready to serve: the database answers within the deadline."""
    try:
        await asyncio.wait_for(store.acall(store.ping), api.ready_deadline_s)
    except Exception as e:  # unreachable, refused, timed out: not ready, whatever the cause
        reason = f"database unreachable: {type(e).__name__}: {e}"[:500]
        return JSONResponse({"ok": False, "reason": reason}, status_code=503)
    return JSONResponse({"ok": True, "reason": "database reachable"})


@router.get("/metrics", include_in_schema=False)
async def metrics(registry: MetricsDep) -> Response:
    body = await run_in_threadpool(registry.exposition)  # reads the database
    return Response(body, media_type=CONTENT_TYPE_LATEST)
