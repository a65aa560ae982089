"""The calls a fleet makes per task (submit, exchange; lease, heartbeat, report), served as raw ASGI in front
of FastAPI when they take the happy path's shape: a JSON body that validates and a token the routes'
check admits. Each runs the route's own function (the same admission, store calls, metrics and
answer bytes); this path only skips FastAPI's per-request machinery (dependency solving, request
parsing, routing through every route), about half of such a call's CPU, which bounds what one
scheduler process serves (docs/queue.md).

Whatever else comes (another route, another content type, a body that does not parse or validate,
a token not admitted) goes on to FastAPI untouched, the body replayed, so every refusal is FastAPI's
own 401 or 422, and the OpenAPI schema and docs are the routes'. A store error or HTTPException
raised by a route's function is answered by the app's own exception handler. `api.hot_path = false`
sends everything through FastAPI (for comparison)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request
from starlette.routing import Match

from protocol import Exchange, Heartbeat, LeaseRequest, Report, ReportBatch, SubmitTask, parse_body
from scheduler.api import reports, tasks, workers
from scheduler.api.answer import Answer
from scheduler.api.auth import admits, bearer_credentials
from scheduler.api.deps import SERVICES
from scheduler.api.services import Services

Call = Callable[[Services, Request, dict[str, Any], Any], Awaitable[Answer]]


@dataclass(frozen=True)
class Hot:
    path: str  # the FastAPI route's template (POST)
    body: type[BaseModel]
    tokens: str  # the Secrets field whose tokens the route admits
    call: Call
    sheds: bool = False  # a submit: refused before its body is read while the process is too busy


HOT = (
    Hot("/v1/tasks", SubmitTask, "client_tokens",
        lambda svc, req, _p, body: tasks.submit_one(svc, body, req, req.headers.get("prefer")), sheds=True),
    Hot("/v1/workers/{worker_id}/lease", LeaseRequest, "worker_tokens",
        lambda svc, req, p, body: workers.lease_for(svc, p["worker_id"], body, req)),
    Hot("/v1/workers/{worker_id}/heartbeat", Heartbeat, "worker_tokens",
        lambda svc, _req, p, body: workers.heartbeat_of(svc, p["worker_id"], body)),
    Hot("/v1/tasks/{task_id}/report", Report, "worker_tokens",
        lambda svc, _req, p, body: reports.report_one(svc, p["task_id"], body)),
    Hot("/v1/reports", ReportBatch, "worker_tokens", lambda svc, _req, _p, body: reports.report_many(svc, body)),
    Hot("/v1/workers/{worker_id}/exchange", Exchange, "worker_tokens",
        lambda svc, req, p, body: workers.exchange_of(svc, p["worker_id"], body, req)),
)


class HotPath:
    """ASGI middleware, the innermost of the scheduler's own (scheduler/app.py): inside the request
    timer and the body limit, which see these calls as they see any other, and outside FastAPI's
    own middleware, which only what it hands on goes through."""

    def __init__(self, app, fastapi: FastAPI) -> None:
        self.app = app
        self._fastapi = fastapi
        # By the path's last segment, which tells the hot routes apart: one route's match per
        # request, not one per hot route (each a regex and FastAPI's route context).
        self._routes = {last_segment(hot.path): (hot, _route(fastapi, hot.path)) for hot in HOT}

    async def __call__(self, scope, receive, send) -> None:
        found = self._match(scope)
        services = scope.get("state", {}).get(SERVICES)
        if found is None or services is None:
            return await self.app(scope, receive, send)
        hot, child = found
        request = _HotRequest(scope, receive)
        if not admits(getattr(services.secrets, hot.tokens), bearer_credentials(request.headers.get("authorization"))):
            return await self.app(scope, receive, send)  # FastAPI's 401
        if hot.sheds and (busy := services.gate.busy(1)) is not None:
            # Its route's own 429 (SubmitGate.taking), for a fraction of the CPU: a saturated process
            # must not spend on the submits it refuses what it lacks for those it serves.
            scope.update(child)
            return await self._handled(busy, request, scope, receive, send)
        received, body = await _read(receive)
        try:
            data = parse_body(hot.body, body) if body is not None else None
        except Exception:  # noqa: BLE001 - FastAPI parses it again and answers as it always has
            data = None
        if data is None:
            return await self.app(scope, _replay(received, receive), send)
        scope.update(child)  # route, endpoint, path_params, as FastAPI's router sets them (the timer reads route)
        try:
            answer = await hot.call(services, request, child["path_params"], data)
        except Exception as exc:
            return await self._handled(exc, request, scope, receive, send)
        await answer.send(send)

    def _match(self, scope) -> tuple[Hot, dict] | None:
        if scope["type"] != "http" or scope["method"] != "POST" or not _json(scope):
            return None
        found = self._routes.get(last_segment(scope["path"]))
        if found is None:
            return None
        hot, route = found
        match, child = route.matches(scope)
        return (hot, child) if match is Match.FULL else None

    async def _handled(self, exc: Exception, request: Request, scope, receive, send) -> None:
        """The app's own handler's answer (the store's 404/409, an HTTPException's 429), as FastAPI's
        exception middleware would give it; anything unhandled goes up as it would there."""
        handlers = self._fastapi.exception_handlers
        handler = next((handlers[k] for k in type(exc).__mro__ if k in handlers), None)
        if handler is None:
            raise exc
        response = handler(request, exc)
        if inspect.isawaitable(response):
            response = await response
        await response(scope, receive, send)


class _HotRequest(Request):
    async def is_disconnected(self) -> bool:
        """Starlette's answer without its cancel scope (anyio's: some 3% of a hot call's CPU, asked
        after every claim): the next message is taken if it is there already, as there, and else
        nothing waits for it. The receive (uvicorn's, under the body limit's: coroutines) is stepped
        once; when it would wait, it is closed where it waits."""
        if self._is_disconnected or not inspect.iscoroutinefunction(self._receive):
            return await super().is_disconnected()
        pending = self._receive()
        try:
            pending.send(None)
        except StopIteration as got:
            self._is_disconnected = got.value.get("type") == "http.disconnect"
        else:
            pending.close()
        return self._is_disconnected


def last_segment(path: str) -> str:
    return path.rpartition("/")[2]


def _route(app: FastAPI, path: str) -> APIRoute:
    return next(r for r in app.routes if isinstance(r, APIRoute) and r.path == path and "POST" in r.methods)


def _json(scope) -> bool:
    """The content type FastAPI reads as JSON in its plainest form; any other goes to FastAPI."""
    for key, value in scope["headers"]:
        if key == b"content-type":
            return value.partition(b";")[0].strip().lower() == b"application/json"
    return False


async def _read(receive) -> tuple[list[dict], bytes | None]:
    """The messages received and the body; None when the client left before sending it all."""
    received, chunks = [], []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return received, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return received, b"".join(chunks)


def _replay(received: list[dict], receive):
    """A receive that gives back what the hot path read, then the client's own."""
    pending = list(received)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed
