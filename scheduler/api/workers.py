"""Workers' routes: register, heartbeat, and the lease long poll; the workers list for workers and
clients, and Prometheus's discovery of the workers' metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Response
from starlette.concurrency import run_in_threadpool

from protocol import Heartbeat, HeartbeatReply, LeaseRequest, LeaseResponse, Registered, RegisterWorker, WorkerView
from scheduler.api.auth import client_auth, reader_auth, worker_auth
from scheduler.api.deps import ClaimsDep, MetricsDep, StoreCall, StoreDep, WaitersDep, WorkersDep
from scheduler.metrics import prometheus_targets

log = logging.getLogger(__name__)
router = APIRouter(tags=["workers"])
auth = [Depends(worker_auth)]


@router.post("/v1/workers", status_code=201, response_model=Registered, dependencies=auth)
async def register(body: RegisterWorker, store: StoreDep, workers: WorkersDep, waiters: WaitersDep) -> Registered:
    worker_id, requeued = await store.acall(workers.register, body)
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
async def lease(worker_id: str, body: LeaseRequest, claims: ClaimsDep, waiters: WaitersDep,
                metrics: MetricsDep) -> LeaseResponse | Response:
    got = await waiters.poll(lambda: claims.aclaim(worker_id, body.max_tasks), body.wait_s)
    if not got:
        return Response(status_code=204)
    metrics.leases.inc(len(got))
    return LeaseResponse(leases=got)


@router.post("/v1/workers/{worker_id}/heartbeat", response_model=HeartbeatReply, dependencies=auth,
             responses={404: {}})
async def heartbeat(worker_id: str, body: Heartbeat, workers: WorkersDep, call: StoreCall) -> HeartbeatReply:
    return await call(workers.heartbeat, worker_id, body)
