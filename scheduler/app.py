"""The reference scheduler's HTTP API (FastAPI). See docs/protocol.md for the protocol in prose."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import math
import re
import time
from collections.abc import AsyncIterator
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from protocol import (
    FINAL_STATUSES,
    Heartbeat,
    HeartbeatReply,
    LeaseRequest,
    LeaseResponse,
    QueueFigures,
    Registered,
    RegisterWorker,
    Report,
    ReportBatch,
    ReportOutcome,
    ReportOutcomes,
    SubmitBatch,
    SubmitTask,
    SubmittedBatch,
    TaskList,
    TaskStatus,
    TaskView,
    WorkerView,
)
from prometheus_client import CONTENT_TYPE_LATEST

from scheduler import servable
from scheduler import status_page as status_page_view
from scheduler.metrics import RequestTimer, SchedulerMetrics, prometheus_targets
from scheduler.results import local_path
from scheduler.store import Cancelled, Conflict, NotFound, Store
from scheduler.limits import RateLimit, client_key, retry_after_s
from scheduler.waiting import TaskWatch
from scheduler.webhooks import Dispatcher, refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    # Empty token sets switch auth off; __main__ allows that only on a loopback address.
    worker_tokens: frozenset[str] = frozenset()
    client_tokens: frozenset[str] = frozenset()
    max_queued: int = 100_000
    max_body_bytes: int = 1 << 20  # 413 beyond: a task's input is a prompt and a few numbers
    sweep_interval_s: float = 1.0
    # Per client (bearer token, or address when auth is off): tasks per second and burst; 0: off.
    rate_limit: float = 0.0
    rate_burst: float = 0.0  # 0: ten seconds' worth
    ready_deadline_s: float = 2.0  # /readyz: the database's answer within this
    status_cache_s: float = 2.0  # one status page gather serves every viewer this long
    max_wait_s: float = 60.0  # the longest `Prefer: wait=N` or `?wait_s=N` a client may ask for
    wait_poll_s: float = 1.0  # how often waits look for tasks ended by another process
    # Hosts a task's webhook may name (host, host:port, *.domain); none: webhooks are refused.
    webhook_allow: tuple[str, ...] = ()
    webhook_secret: bytes = b""  # the HMAC-SHA256 key of every webhook's signature
    webhook_max_age_s: float = 3600.0  # retries of one webhook event stop this long after the first
    remove_expired_results: bool = False  # delete an expired task's local result file (under results_roots)
    # Folders whose result files the status page may show as thumbnails (resolved paths).
    results_roots: tuple[Path, ...] = ()
    # Accept inputs no live worker's advertised limits allow (workers that start later, mixed models):
    # they then fail at their worker with invalid_request instead of a 422 at submission.
    admit_unservable: bool = False
    # A waiting lease request looks again this often without a wake-up: the fallback for a missed
    # NOTIFY. Wake-ups (local, or NOTIFY from other processes) make new work visible at once.
    poll_s: float = 5.0


class Waiters:
    """Long-polling lease requests, in arrival order. Work that appears wakes at most as many of
    them as it can serve (no thundering herd); each also looks again every `poll_s`, in case a
    wake-up from another scheduler process was missed."""

    def __init__(self) -> None:
        self._queue: deque[asyncio.Future] = deque()

    def enlist(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        return fut

    def leave(self, fut: asyncio.Future, served: bool) -> None:
        """Done waiting. A wake-up that came while this request found work anyway goes to the next."""
        try:
            self._queue.remove(fut)
        except ValueError:
            pass
        if served and fut.done():
            self.notify(1)

    def notify(self, n: int) -> None:
        while n > 0 and self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1


def _bearer_checker(*tokens_of: str):
    scheme = HTTPBearer(auto_error=False)

    async def check(request: Request, cred: HTTPAuthorizationCredentials | None = Depends(scheme)) -> None:
        tokens: frozenset[str] = frozenset().union(*(getattr(request.app.state.settings, t) for t in tokens_of))
        if not tokens:
            return
        if cred is None or not any(hmac.compare_digest(cred.credentials, t) for t in tokens):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


worker_auth = _bearer_checker("worker_tokens")
client_auth = _bearer_checker("client_tokens")
reader_auth = _bearer_checker("worker_tokens", "client_tokens")  # either may read the workers list


def create_app(store: Store, settings: Settings = Settings()) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await store.aopen()
        app.state.waiters = waiters = Waiters()
        app.state.watch = TaskWatch(store, app.state.settings.wait_poll_s)
        s = app.state.settings
        app.state.rate = RateLimit(s.rate_limit, s.rate_burst or max(1.0, s.rate_limit * 10))
        app.state.pace = {"at": float("-inf"), "ended": 0}  # tasks ended in the last minute, cached
        sweeper = asyncio.create_task(_sweep_forever(app))
        dispatcher = None
        if s.webhook_allow:  # off the request path: a slow receiver delays only its own calls
            dispatcher = asyncio.create_task(Dispatcher(store, s.webhook_secret, max_age_s=s.webhook_max_age_s,
                                                        metrics=app.state.metrics).run())
        if listen := getattr(store, "listen", None):  # other scheduler processes' new work (PostgreSQL)
            loop = asyncio.get_running_loop()
            listen(lambda n: loop.call_soon_threadsafe(waiters.notify, n))
        yield
        sweeper.cancel()
        if dispatcher is not None:
            dispatcher.cancel()
        await app.state.watch.close()
        await store.aclose()

    app = FastAPI(title="dit-worker reference scheduler", version="1", lifespan=lifespan)
    app.state.store = store
    app.state.settings = settings
    app.state.metrics = metrics = SchedulerMetrics(store)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestTimer, metrics=metrics)  # outermost: a 413 is timed too
    app.add_exception_handler(RequestValidationError, _validation_error)
    _client_routes(app)
    _worker_routes(app)
    _ops_routes(app)
    _status_routes(app)
    return app


async def page_auth(request: Request) -> None:
    """The status page, for browsers: a client token as the password of HTTP Basic auth (the browser
    asks for it) or as a bearer token. Open when client auth is off (loopback only)."""
    tokens: frozenset[str] = request.app.state.settings.client_tokens
    if not tokens:
        return
    given = ""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        given = value
    elif scheme.lower() == "basic":
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            given = base64.b64decode(value, validate=True).decode().partition(":")[2]
    if not given or not any(hmac.compare_digest(given, t) for t in tokens):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a client token is needed (any user name, the token "
                            "as password)", headers={"WWW-Authenticate": 'Basic realm="dit-scheduler"'})


def _status_routes(app: FastAPI) -> None:
    store: Store = app.state.store
    auth = [Depends(page_auth)]

    # The page's reads scan the last hour (about 1 s at a million tasks an hour on SQLite): one
    # gather serves every viewer for `status_cache_s`, however many browsers refresh.
    cached: dict = {"at": float("-inf"), "html": ""}
    gathering = asyncio.Lock()

    @app.get("/status", tags=["ops"], response_class=HTMLResponse, dependencies=auth)
    async def status_page() -> HTMLResponse:
        """Workers, queue, the last hour, recent results and failures; refreshes itself."""
        async with gathering:
            if time.monotonic() - cached["at"] >= app.state.settings.status_cache_s:
                page = await run_in_threadpool(status_page_view.gather, store)  # several reads: off the loop
                cached.update(at=time.monotonic(), html=status_page_view.render(page))
        return HTMLResponse(cached["html"], headers={"Cache-Control": "no-store"})

    @app.get("/status/thumbs/{task_id}.png", tags=["ops"], dependencies=auth, responses={404: {}},
             response_class=Response)
    async def thumbnail(task_id: str) -> Response:
        try:
            png = await run_in_threadpool(status_page_view.thumbnail, store, app.state.settings.results_roots,
                                          task_id)
        except NotFound as e:
            raise HTTPException(404, str(e)) from e
        return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})


def _ops_routes(app: FastAPI) -> None:
    """For load balancers, orchestrators and Prometheus; no auth (nothing here is a secret)."""
    store: Store = app.state.store

    @app.get("/livez", tags=["ops"])
    @app.get("/healthz", tags=["ops"])
    async def livez() -> dict[str, str]:
        """The process answers: its event loop turns."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"description": "database unreachable"}})
    async def readyz() -> JSONResponse:
        """Ready to serve: the database answers within the deadline."""
        try:
            await asyncio.wait_for(store.acall(store.ping), app.state.settings.ready_deadline_s)
        except Exception as e:  # unreachable, refused, timed out: not ready, whatever the cause
            reason = f"database unreachable: {type(e).__name__}: {e}"[:500]
            return JSONResponse({"ok": False, "reason": reason}, status_code=503)
        return JSONResponse({"ok": True, "reason": "database reachable"})

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    async def metrics() -> Response:
        body = await run_in_threadpool(app.state.metrics.exposition)  # reads the database
        return Response(body, media_type=CONTENT_TYPE_LATEST)


class BodyLimit:
    """413 for a request body over `max_bytes`, by its Content-Length or, when chunked, as it
    arrives, before anything parses it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._too_large(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope, receive, send) -> None:
        resp = JSONResponse({"detail": f"request body over {self.max_bytes} bytes"}, status_code=413)
        await resp(scope, receive, send)


class _TooLarge(BaseException):
    """A BaseException: FastAPI turns any Exception raised while reading a body into a 400."""


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each field and what is wrong, without echoing the input: a NaN, an infinity or a
    huge value sent back would make the answer itself fail."""
    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
              for e in exc.errors()]
    return JSONResponse({"detail": errors}, status_code=422)


async def _sweep_forever(app: FastAPI) -> None:
    # Maintenance: expired leases, silent workers, old registrations. No request does this itself.
    while True:
        await asyncio.sleep(app.state.settings.sweep_interval_s)
        try:
            if moved := await app.state.store.acall(app.state.store.upkeep.sweep):
                app.state.waiters.notify(moved)
            if expired := await app.state.store.acall(app.state.store.upkeep.purge):
                await run_in_threadpool(_remove_results, expired, app.state.settings)
        except Exception:  # a locked or broken DB must not end the sweeper
            log.exception("lease sweep failed")


def _remove_results(uris: list[str], settings: Settings) -> None:
    """Expired tasks' local result files, when the operator asked for it, and only under the results
    roots. Objects in GCS are left to the bucket's lifecycle rule (docs/deploy.md)."""
    if not settings.remove_expired_results:
        return
    for uri in uris:
        if (path := local_path(uri, settings.results_roots)) is not None:
            path.unlink(missing_ok=True)


def _client_routes(app: FastAPI) -> None:
    store: Store = app.state.store
    submissions = app.state.metrics.submissions

    @app.post("/v1/tasks", status_code=201, response_model=TaskView, tags=["clients"],
              dependencies=[Depends(client_auth)],
              responses={200: {"description": "idempotent replay"}, 409: {}, 429: {}})
    async def submit(body: SubmitTask, request: Request, response: Response,
                     prefer: str | None = Header(None, description="`wait=N`: answer once the task ends, "
                                                 "or after N seconds (capped) with the task as it stands")) -> TaskView:
        _check_webhooks(app, [body])
        await _check_servable(app, [body])
        await _admit(app, request, 1)
        try:
            task, created = await store.acall(store.tasks.submit, body)
        except Conflict as e:
            submissions.labels("conflict").inc()
            raise HTTPException(409, str(e)) from e
        submissions.labels("created" if created else "replayed").inc()
        if created:
            app.state.waiters.notify(1)
        else:
            response.status_code = 200
        if (wait_s := _preferred_wait(prefer, app.state.settings.max_wait_s)) is not None:
            response.headers["Preference-Applied"] = f"wait={wait_s:g}"
            task = await _waited(app, task, wait_s)
        return task

    @app.post("/v1/tasks/batch", status_code=201, response_model=SubmittedBatch, tags=["clients"],
              dependencies=[Depends(client_auth)], responses={409: {}, 429: {}})
    async def submit_batch(body: SubmitBatch, request: Request) -> SubmittedBatch:
        """Many tasks in one call and one transaction: all are stored, or none."""
        _check_webhooks(app, body.tasks)
        await _check_servable(app, body.tasks)
        await _admit(app, request, len(body.tasks))
        try:
            out = await store.acall(store.tasks.submit_many, body.tasks)
        except Conflict as e:
            submissions.labels("conflict").inc(len(body.tasks))
            raise HTTPException(409, str(e)) from e
        created = sum(c for _, c in out)
        submissions.labels("created").inc(created)
        submissions.labels("replayed").inc(len(out) - created)
        app.state.waiters.notify(created)
        return SubmittedBatch(tasks=[t for t, _ in out], created=[c for _, c in out])

    @app.get("/v1/queue", response_model=QueueFigures, tags=["clients"], dependencies=[Depends(client_auth)])
    async def queue_figures() -> QueueFigures:
        """Depth per priority, the oldest queued task's age, tasks ended in the last 1, 5 and 15
        minutes, workers by status: for autoscalers and dashboards."""
        return await run_in_threadpool(store.tasks.figures)  # may scan: never on the event loop

    @app.get("/v1/tasks/{task_id}", response_model=TaskView, tags=["clients"],
             dependencies=[Depends(client_auth)], responses={404: {}})
    async def get_task(task_id: str, wait_s: float = Query(0, ge=0, le=3600, description=(
            "long poll: answer once the task ends, or after this many seconds (capped by the scheduler)"))
            ) -> TaskView:
        try:
            task = await store.acall(store.tasks.get, task_id)
        except NotFound as e:
            raise HTTPException(404, str(e)) from e
        return await _waited(app, task, min(wait_s, app.state.settings.max_wait_s))

    @app.post("/v1/tasks/{task_id}/cancel", response_model=TaskView, tags=["clients"],
              dependencies=[Depends(client_auth)], responses={404: {}, 409: {"description": "already ended"}})
    async def cancel(task_id: str) -> TaskView:
        """A queued task ends `cancelled` at once. A leased or processing one is marked
        (`cancel_requested_at`): its worker drops it or discards its result, and it ends `cancelled`,
        never `succeeded`. A task that has ended answers 409 and does not change."""
        try:
            task = await store.acall(store.reports.cancel, task_id)
        except NotFound as e:
            raise HTTPException(404, str(e)) from e
        except Conflict as e:
            raise HTTPException(409, str(e)) from e
        if task.status in FINAL_STATUSES:
            app.state.watch.ended([task_id])
        return task

    @app.get("/v1/tasks", response_model=TaskList, tags=["clients"], dependencies=[Depends(client_auth)])
    async def list_tasks(status: TaskStatus | None = None, limit: int = Query(100, ge=1, le=1000),
                         offset: int = Query(0, ge=0, le=1_000_000_000)) -> TaskList:
        return TaskList(tasks=await run_in_threadpool(store.tasks.list, status, limit, offset))


def _worker_routes(app: FastAPI) -> None:
    store: Store = app.state.store
    metrics: SchedulerMetrics = app.state.metrics
    auth = [Depends(worker_auth)]

    @app.post("/v1/workers", status_code=201, response_model=Registered, tags=["workers"],
              dependencies=auth)
    async def register(body: RegisterWorker) -> Registered:
        worker_id, requeued = await store.acall(store.workers.register, body)
        log.info("registered %s: %s, %d rank(s), model %s, node %s", worker_id, body.hostname,
                 body.world_size, body.model, body.node_id)
        if requeued:
            log.warning("node %s restarted: %d task(s) it held requeued", body.node_id, requeued)
            app.state.waiters.notify(requeued)
        return Registered(worker_id=worker_id, lease_ttl_s=store.lease_ttl_s)

    @app.get("/v1/workers", response_model=list[WorkerView], tags=["workers"], dependencies=[Depends(reader_auth)])
    async def list_workers() -> list[WorkerView]:
        return await run_in_threadpool(store.workers.workers)

    @app.get("/v1/workers/targets", tags=["workers"], dependencies=[Depends(client_auth)])
    async def metrics_targets() -> list[dict]:
        """Every live worker's /metrics in Prometheus's HTTP service discovery format
        (http_sd_configs): launch a node and Prometheus finds it."""
        return prometheus_targets(await run_in_threadpool(store.workers.workers))

    @app.post("/v1/workers/{worker_id}/lease", response_model=LeaseResponse, tags=["workers"],
              dependencies=auth, responses={204: {"description": "no work within wait_s"}, 404: {}})
    async def lease(worker_id: str, body: LeaseRequest) -> LeaseResponse | Response:
        end = time.monotonic() + body.wait_s
        waiters: Waiters = app.state.waiters
        while True:
            woken = waiters.enlist()  # before the claim, so work added meanwhile is not missed
            got = []
            try:
                got = await store.claims.aclaim(worker_id, body.max_tasks)
                left = end - time.monotonic()
                if got or left <= 0:
                    break
                await asyncio.wait({woken}, timeout=min(left, app.state.settings.poll_s))
            except NotFound as e:
                raise HTTPException(404, str(e)) from e
            finally:
                waiters.leave(woken, served=bool(got))
        if not got:
            return Response(status_code=204)
        metrics.leases.inc(len(got))
        return LeaseResponse(leases=got)

    @app.post("/v1/workers/{worker_id}/heartbeat", response_model=HeartbeatReply, tags=["workers"],
              dependencies=auth, responses={404: {}})
    async def heartbeat(worker_id: str, body: Heartbeat) -> HeartbeatReply:
        try:
            return await store.acall(store.workers.heartbeat, worker_id, body)
        except NotFound as e:
            raise HTTPException(404, str(e)) from e

    @app.post("/v1/reports", response_model=ReportOutcomes, tags=["workers"], dependencies=auth)
    async def report_batch(body: ReportBatch) -> ReportOutcomes:
        """Several tasks' reports in one call, each applied on its own and atomically: the
        answer holds, per report, the status code its single call would have had."""
        items = [(r.task_id, Report(**r.model_dump(exclude={"task_id"}))) for r in body.reports]
        outcomes = await store.reports.areport_many(items)
        results = []
        for (task_id, rep), out in zip(items, outcomes):
            metrics.reports.labels(rep.status, _report_outcome(out)).inc()
            if isinstance(out, TaskView):
                results.append(ReportOutcome(task_id=task_id, status_code=200, task=out))
            else:
                results.append(ReportOutcome(task_id=task_id, status_code=404 if isinstance(out, NotFound) else 409,
                                             detail=str(out)))
        if requeued := sum(r.task is not None and r.task.status == "queued" for r in results):
            app.state.waiters.notify(requeued)
        app.state.watch.ended(task_id for (task_id, _), out in zip(items, outcomes) if _ended(out))
        return ReportOutcomes(results=results)

    @app.post("/v1/tasks/{task_id}/report", response_model=TaskView, tags=["workers"],
              dependencies=auth, responses={404: {}, 409: {"description": "stale lease token"}})
    async def report(task_id: str, body: Report) -> TaskView:
        try:
            task = await store.reports.areport(task_id, body)
        except (NotFound, Conflict) as e:
            metrics.reports.labels(body.status, _report_outcome(e)).inc()
            if _ended(e):
                app.state.watch.ended([task_id])
            raise HTTPException(404 if isinstance(e, NotFound) else 409, str(e)) from e
        metrics.reports.labels(body.status, "accepted").inc()
        if _ended(task):
            app.state.watch.ended([task_id])
        if task.status == "queued":  # a retryable failure or a release went back to the queue
            app.state.waiters.notify(1)
        return task


def _check_webhooks(app: FastAPI, tasks: list[SubmitTask]) -> None:
    """422 naming the host when a task's webhook is not on the operator's allowlist."""
    for i, task in enumerate(tasks):
        if task.webhook is not None and (why := refusal(task.webhook.url, app.state.settings.webhook_allow)):
            raise HTTPException(422, f"tasks[{i}]: {why}" if len(tasks) > 1 else why)


async def _check_servable(app: FastAPI, tasks: list[SubmitTask]) -> None:
    """422 naming the field when no live worker's limits allow a task's input: better now than a
    failure once leased. Nothing is refused while no live worker is registered (the fleet may start
    later), nor with --admit-unservable."""
    if app.state.settings.admit_unservable:
        return
    store: Store = app.state.store
    fleet = await store.acall(store.workers.fleet_limits)
    for i, task in enumerate(tasks):
        if why := servable.refusal(task.input, fleet):
            app.state.metrics.submissions.labels("unservable").inc(len(tasks))
            raise HTTPException(422, f"tasks[{i}]: {why}" if len(tasks) > 1 else why)


async def _admit(app: FastAPI, request: Request, n: int) -> None:
    """429 with a Retry-After when the queue is full or this client is over its rate; n tasks."""
    settings: Settings = app.state.settings
    store: Store = app.state.store
    queued = await store.acall(store.tasks.queued_count)
    if queued + n > settings.max_queued:
        app.state.metrics.submissions.labels("refused").inc(n)
        retry = retry_after_s(queued + n - settings.max_queued, await _pace(app))
        raise HTTPException(429, f"queue is full ({queued} queued, limit {settings.max_queued}); at the recent "
                            f"pace there is room in about {retry}s", headers={"Retry-After": str(retry)})
    client = client_key(request.headers.get("authorization"), request.client.host if request.client else None)
    wait = app.state.rate.take(client, n)
    if wait == math.inf:
        raise HTTPException(422, f"{n} tasks in one call is over this client's burst ({app.state.rate.burst:g}); "
                            "send fewer per call")
    if wait > 0:
        app.state.metrics.submissions.labels("rate_limited").inc(n)
        raise HTTPException(429, f"rate limit: {settings.rate_limit:g} tasks/s per client", headers={
            "Retry-After": str(max(1, math.ceil(wait)))})


async def _pace(app: FastAPI) -> int:
    """Tasks ended in the last minute, read at most every 5 s (a full queue must not cost a scan per
    refused request)."""
    pace = app.state.pace
    if time.monotonic() - pace["at"] > 5:
        store: Store = app.state.store
        pace.update(at=time.monotonic(), ended=await run_in_threadpool(store.tasks.ended_since, 60))
    return pace["ended"]


def _ended(out: object) -> bool:
    """A report's outcome that ended its task (accepted final, or refused because cancelled)."""
    return isinstance(out, Cancelled) or (isinstance(out, TaskView) and out.status in FINAL_STATUSES)


_WAIT = re.compile(r'(?:^|[,;\s])wait\s*=\s*"?(\d+(?:\.\d+)?)"?', re.IGNORECASE)


def _preferred_wait(prefer: str | None, cap_s: float) -> float | None:
    """`Prefer: wait=N` (RFC 7240), capped; None when the header asks for no wait."""
    if not prefer or not (m := _WAIT.search(prefer)):
        return None
    return min(float(m.group(1)), cap_s)


async def _waited(app: FastAPI, task: TaskView, wait_s: float) -> TaskView:
    """The task once it has ended, or as it stands after `wait_s`. No connection is held meanwhile."""
    if wait_s <= 0 or task.status in FINAL_STATUSES:
        return task
    store: Store = app.state.store
    await app.state.watch.wait(task.id, wait_s)
    return await store.acall(store.tasks.get, task.id)


def _report_outcome(out: object) -> str:
    if isinstance(out, Cancelled):
        return "cancelled"
    return "not_found" if isinstance(out, NotFound) else "conflict" if isinstance(out, Conflict) else "accepted"
