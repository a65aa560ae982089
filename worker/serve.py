"""Rank 0's serve loop: the request lifecycle, one stage a method.

    lease -> validate -> [text check] -> report processing -> broadcast -> generate (all ranks)
          -> gather -> [image check] -> encode -> store -> report result

Stages in brackets are filled by the content-safety issue. Any exception while handling a task fails
that task with an error envelope and the loop goes on; a CollectiveError propagates and the process
exits (see worker.distributed).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections import deque
from importlib import metadata

from scheduler.protocol import DeviceInfo, ErrorEnvelope, Lease, RegisterWorker, Report, TaskResult
from worker import lockstep
from worker.config import WorkerConfig
from worker.distributed import DistContext, broadcast
from worker.encode import encode_image
from worker.engine import Engine
from worker.heartbeat import HeartbeatThread, WorkerState
from worker.queue_client import AuthError, LeaseLost, NotFound, QueueClient, QueueError, Unavailable
from worker.storage import Store
from worker.validation import InvalidRequest, Job, validate_task

log = logging.getLogger(__name__)


def default_seed(task_id: str) -> int:
    """The seed of a task that names none: derived from the task id, so every attempt of a task
    draws the same image and a late attempt overwriting the object writes the same bytes.
    32 bits fit every common RNG; clients may send seeds up to 2**63 - 1."""
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big")


class FatalQueueError(RuntimeError):
    """The scheduler refuses this worker (auth); serving cannot go on."""


class Coordinator:
    def __init__(self, cfg: WorkerConfig, ctx: DistContext, client: QueueClient, store: Store) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.client = client
        self.store = store
        self.state = WorkerState()
        self.worker_id = ""
        self._devices: list[DeviceInfo] = []
        self._heartbeat: HeartbeatThread | None = None
        self._backlog: deque[Lease] = deque()  # leased, not yet admitted
        self._leases: dict[str, Lease] = {}  # admitted, not yet finally reported
        self._stop = threading.Event()
        self._idle_failures = 0

    # ------------------------------------------------------------ lifecycle

    def register(self, devices: list[DeviceInfo]) -> None:
        self._devices = devices  # kept for re-registering if the scheduler forgets this worker
        info = RegisterWorker(hostname=socket.gethostname(), world_size=self.ctx.world_size,
                              devices=devices, model=self.cfg.model.name, version=_version())
        try:
            # Generous: the scheduler may be restarting while this node boots.
            reg = self.client.register(info, deadline_s=300.0)
        except AuthError as e:
            raise FatalQueueError(str(e)) from e
        self.worker_id = reg.worker_id
        log.info("registered as %s (lease ttl %.0fs)", reg.worker_id, reg.lease_ttl_s)
        if self._heartbeat is None:
            self._heartbeat = HeartbeatThread(self.client, self.worker_id, self.state,
                                              self.cfg.queue.heartbeat_interval_s)
            self._heartbeat.start()
        else:
            self._heartbeat.worker_id = self.worker_id

    def request_stop(self) -> None:
        """Graceful drain: stop leasing, finish what is held, then shut the followers down."""
        if not self._stop.is_set():
            log.info("draining: no new leases; finishing %d held task(s)", len(self._backlog))
            self.state.set_status("draining")
            self._stop.set()

    def serve(self, engine: Engine) -> None:
        self.state.set_status("ready")
        try:
            while not (self._stop.is_set() and not self._backlog):
                job = self._next_job()
                if job is None:
                    broadcast(lockstep.Idle(), self.ctx)
                    continue
                broadcast(lockstep.Generate(job), self.ctx)
                self._finish(job, lockstep.generate(engine, job, self.ctx))
                # Keep-alive: followers' wait for the next command must not include this turn's I/O.
                broadcast(lockstep.Idle(), self.ctx)
            broadcast(lockstep.Shutdown("drained"), self.ctx)
        finally:
            if self._heartbeat:
                self._heartbeat.stop()

    # ------------------------------------------------------------ stages

    def _next_job(self) -> Job | None:
        """lease -> validate -> report processing. None when there is nothing to run this turn."""
        if not self._backlog and not self._stop.is_set():
            self._backlog.extend(self._lease())
        while self._backlog:
            lease = self._backlog.popleft()
            job = self._admit(lease)
            if job is not None:
                return job
        return None

    def _lease(self) -> list[Lease]:
        if self.state.worker_unknown.is_set():
            self.state.worker_unknown.clear()
            self.register(self._devices)
        try:
            leases = self.client.lease(self.worker_id, self.cfg.queue.max_tasks, self.cfg.queue.lease_wait_s)
        except NotFound:
            self.state.worker_unknown.set()
            return []
        except AuthError as e:
            raise FatalQueueError(str(e)) from e
        except QueueError as e:
            self._idle_backoff(e)
            return []
        self._idle_failures = 0
        for lease in leases:
            self.state.begin(lease.task_id)  # from now on the heartbeat renews it
        return leases

    def _idle_backoff(self, err: QueueError) -> None:
        self._idle_failures += 1
        cap = self.cfg.queue.idle_backoff_max_s
        wait = min(cap, 0.5 * 2 ** (self._idle_failures - 1))
        if isinstance(err, Unavailable) and err.retry_after is not None:
            wait = min(cap, err.retry_after)
        log.warning("lease failed (%s); next try in %.1fs", err, wait)
        self._stop.wait(wait)

    def _admit(self, lease: Lease) -> Job | None:
        try:
            job = validate_task(lease.task_id, lease.input, self.cfg.limits)
        except InvalidRequest as e:
            self._fail(lease, "invalid_request", str(e), retryable=False)
            return None
        # Text safety check goes here, before any GPU work (content-safety issue).
        if job.seed is None:
            job = job.model_copy(update={"seed": default_seed(job.task_id)})
        try:
            self._report(lease, "processing")
        except QueueError as e:  # lease lost (409) or the report could not be delivered
            log.warning("task %s dropped before generation: %s", lease.task_id, e)
            self.state.end(lease.task_id)
            return None
        self._leases[job.task_id] = lease
        return job

    def _finish(self, job: Job, out: lockstep.Outcome) -> None:
        """[image check] -> encode -> store -> report, for a job every rank has generated."""
        lease = self._leases.pop(job.task_id)
        try:
            if out.errors:
                self._fail(lease, "generation_failed", "; ".join(out.errors), retryable=True)
                return
            if self.state.is_lost(job.task_id):  # a newer attempt owns the task and its object
                log.warning("task %s: lease lost during generation; result discarded", job.task_id)
                self.state.end(job.task_id)
                return
            # Image safety check goes here, before anything is stored (content-safety issue).
            t0 = time.perf_counter()
            data, content_type = encode_image(out.image, job.output_format)
            t1 = time.perf_counter()
            obj = self.store.put(job.task_id, data, content_type)
            t2 = time.perf_counter()
        except Exception as e:
            log.exception("task %s failed after generation", job.task_id)
            self._fail(lease, "storage_failed", f"{type(e).__name__}: {e}", retryable=True)
            return
        result = TaskResult(
            uri=obj.uri, content_type=content_type, width=job.width, height=job.height, seed=job.seed,
            bytes=obj.bytes, sha256=obj.sha256,
            timings_ms={"generate": out.seconds * 1e3, "encode": (t1 - t0) * 1e3, "store": (t2 - t1) * 1e3},
        )
        self._deliver(lease, Report(worker_id=self.worker_id, lease_token=lease.lease_token,
                                    status="succeeded", result=result))

    # ------------------------------------------------------------ reporting

    def _fail(self, lease: Lease, code: str, message: str, *, retryable: bool) -> None:
        log.info("task %s failed: %s: %s", lease.task_id, code, message)
        error = ErrorEnvelope(code=code, message=message, retryable=retryable, worker_id=self.worker_id)
        self._deliver(lease, Report(worker_id=self.worker_id, lease_token=lease.lease_token,
                                    status="failed", error=error))

    def _deliver(self, lease: Lease, rep: Report) -> None:
        """Final report. If it cannot be delivered, the lease expires and the task is retried; the
        object name is derived from the task id, so the retry overwrites rather than duplicates."""
        try:
            self.client.report(lease.task_id, rep, deadline_s=self.cfg.queue.report_deadline_s)
        except LeaseLost as e:
            log.warning("task %s: lease lost, result not reported: %s", lease.task_id, e)
        except QueueError as e:
            log.error("task %s: report undeliverable, lease will expire: %s", lease.task_id, e)
        else:
            if rep.status == "succeeded":
                log.info("task %s succeeded: %s", lease.task_id, rep.result.uri)
        finally:
            self.state.end(lease.task_id)

    def _report(self, lease: Lease, status: str) -> None:
        self.client.report(lease.task_id, Report(worker_id=self.worker_id, lease_token=lease.lease_token,
                                                 status=status), deadline_s=self.cfg.queue.report_deadline_s)


def _version() -> str:
    try:
        return metadata.version("dit-worker")
    except metadata.PackageNotFoundError:
        return "0+unknown"
