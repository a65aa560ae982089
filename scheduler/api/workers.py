"""Workers' routes: register, heartbeat, and the lease long poll; the workers list for workers and
clients, and Prometheus's discovery of the workers' metrics."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from protocol import (
    Exchange,
    Exchanged,
    Heartbeat,
    HeartbeatReply,
    Lease,
    LeaseRequest,
    LeaseResponse,
    Registered,
    RegisterWorker,
    RegistrationStatus,
    Report,
    WorkerView,
)
from scheduler.api import reports
from scheduler.api.answer import Answer
from scheduler.api.auth import client_auth, reader_auth, worker_auth
from scheduler.api.deps import GateDep, ServicesDep, StoreDep, WaitersDep, WorkersDep
from scheduler.api.services import Services
from scheduler.store import Reports
from scheduler.metrics import prometheus_targets

log = logging.getLogger(__name__)
router = APIRouter(tags=["workers"])
auth = [Depends(worker_auth)]


@router.post("/v1/workers", status_code=201, response_model=Registered, dependencies=auth)
async def register(body: RegisterWorker, store: StoreDep, workers: WorkersDep, waiters: WaitersDep,
                   gate: GateDep) -> Registered:
    worker_id, requeued = await store.acall(workers.register, body)
    gate.fleet_changed()  # its limits count for the next submission
    log.info("registered %s: %s, %d rank(s), model %s, node %s", worker_id, body.hostname,
             body.world_size, body.model, body.node_id)
    if requeued:
        log.warning("node %s restarted: %d task(s) it held requeued", body.node_id, requeued)
        waiters.notify(requeued)
    return Registered(worker_id=worker_id, lease_ttl_s=store.lease_ttl_s)


@router.get("/v1/workers", response_model=list[WorkerView], dependencies=[Depends(reader_auth)])
async def list_workers(workers: WorkersDep) -> list[WorkerView]:
    return await run_in_threadpool(workers.workers)


@router.get("/v1/workers/targets", dependencies=[Depends(client_auth)])
async def metrics_targets(workers: WorkersDep) -> list[dict]:
    """Every live worker's /metrics in Prometheus's HTTP service discovery format
    (http_sd_configs): launch a node and Prometheus finds it."""
    return prometheus_targets(await run_in_threadpool(workers.workers))


@router.post("/v1/workers/{worker_id}/lease", response_model=LeaseResponse, dependencies=auth,
             responses={204: {"description": "no work within wait_s"}, 404: {}})
async def lease(worker_id: str, body: LeaseRequest, request: Request, svc: ServicesDep) -> Response:
    return (await lease_for(svc, worker_id, body, request)).response()


async def lease_for(svc: Services, worker_id: str, body: LeaseRequest, request: Request) -> Answer:
    """Up to max_tasks leases, waiting up to wait_s for work; 204 when none came."""
    got = await _claimed(svc, worker_id, body.max_tasks, body.wait_s, body.resident, request, adapters=body.adapters)
    return Answer.of(LeaseResponse(leases=got)) if got else Answer(204)


@router.post("/v1/workers/{worker_id}/exchange", response_model=Exchanged, dependencies=auth, responses={404: {}})
async def exchange(worker_id: str, body: Exchange, request: Request, svc: ServicesDep) -> Response:
    return (await exchange_of(svc, worker_id, body, request)).response()


async def exchange_of(svc: Services, worker_id: str, body: Exchange, request: Request) -> Answer:
    """A worker's reports applied (each as POST /v1/reports would), the cancel notices of what it
    holds, then its new leases: to a retry, those its exchange claimed first if it still holds them,
    else a claim (long-polling up to wait_s), tagged with its exchange_id."""
    store = svc.store
    cancelled = await store.claims.acancelled_among(worker_id, body.held) if body.held else []
    got: list[Lease] = []
    if body.retry and body.max_tasks:
        got = await store.acall(store.claims.claimed, worker_id, body.exchange_id)
    # Outcomes without the tasks: the worker reads the codes (and an answer stays small).
    applying = reports.applied(svc, body.reports, with_tasks=False) if body.reports else _nothing()
    if body.max_tasks and not got:
        # Started in the same turn, after the reports: the claim's statement joins their transaction
        # (one commit for the exchange) and sees what they changed (a task they requeued).
        results, got = await asyncio.gather(applying, _claimed(svc, worker_id, body.max_tasks, body.wait_s,
                                                               body.resident, request, body.exchange_id,
                                                               body.adapters))
    else:
        results = await applying
        if not body.max_tasks and not body.reports:
            await store.acall(store.workers.known, worker_id)  # 404 to a worker the scheduler does not know
    return Answer.of(Exchanged(results=results, leases=got, cancelled=cancelled))


async def _nothing() -> list:
    return []


async def _claimed(svc: Services, worker_id: str, max_tasks: int, wait_s: float, resident: list[str] | None,
                   request: Request, claim_id: str | None = None, adapters: list[str] | None = None) -> list[Lease]:
    """Up to max_tasks leases, waiting up to wait_s for work; none given to a caller that has left."""
    claims, waiters, metrics = svc.store.claims, svc.waiters, svc.metrics
    got = await waiters.poll(lambda: claims.aclaim(worker_id, max_tasks, resident, claim_id, adapters), wait_s,
                             request.is_disconnected)
    if got and await request.is_disconnected():
        # Its worker gave up on the long poll (a timeout, a restart) while the claim ran: nobody
        # would run these tasks before their lease expired. Back in the queue, the attempt uncounted.
        await give_back(worker_id, got, svc.store.reports)
        metrics.leases_given_back.inc(len(got))
        waiters.notify(len(got))
        return []
    if got:
        svc.gate.load.taken(len(got))
        metrics.leases.inc(len(got))
    return got


async def give_back(worker_id: str, got: list[Lease], reports: Reports) -> None:
    """Releases leases nobody will receive, as the worker's own `released` report would."""
    outcomes = await reports.areport_many([(le.task_id, Report(worker_id=worker_id, lease_token=le.lease_token,
                                                               status="released")) for le in got])
    for le, out in zip(got, outcomes):
        if isinstance(out, Exception):  # already changed (a cancel): nothing of ours to give back
            log.info("lease on %s not given back: %s", le.task_id, out)


@router.post("/v1/workers/{worker_id}/heartbeat", response_model=HeartbeatReply, dependencies=auth,
             responses={404: {}})
async def heartbeat(worker_id: str, body: Heartbeat, svc: ServicesDep) -> Response:
    return (await heartbeat_of(svc, worker_id, body)).response()


async def heartbeat_of(svc: Services, worker_id: str, body: Heartbeat) -> Answer:
    """The leases renewed, those lost and those cancelled."""
    reply = await svc.store.acall(svc.store.workers.heartbeat, worker_id, body)
    if body.status in (RegistrationStatus.DRAINING, RegistrationStatus.DRAINED):
        svc.gate.fleet_changed()  # it takes no new tasks: its limits no longer count
    return Answer.of(reply)
