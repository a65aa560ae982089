"""The status page for people (workers, queue, the last hour, recent results and failures) and its
thumbnails; a client token is its password."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from scheduler import status_page as view
from scheduler.api.auth import page_auth
from scheduler.api.deps import ApiDep, StatusPageDep, StoreDep

router = APIRouter(tags=["ops"], dependencies=[Depends(page_auth)])


@router.get("/status", response_class=HTMLResponse)
async def status_page(store: StoreDep, api: ApiDep, cached: StatusPageDep) -> HTMLResponse:
    """Workers, queue, the last hour, recent results and failures; refreshes itself."""
    async def gather() -> str:
        return view.render(await run_in_threadpool(view.gather, store))  # several reads: off the loop

    html = await cached.get(gather, api.status_cache_s)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


@router.get("/status/thumbs/{task_id}.png", responses={404: {}}, response_class=Response)
async def thumbnail(task_id: str, store: StoreDep, api: ApiDep) -> Response:
    png = await run_in_threadpool(view.thumbnail, store, api.results.roots, task_id)
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})
