"""Rank 0's serve loop: the request lifecycle, one stage a method.

    [intake thread: lease -> validate -> text check -> report processing]  (worker.intake)
      -> take a round of compatible jobs -> broadcast -> generate (all ranks, worker.lockstep)
      -> [post pool: quality check -> image check -> encode -> store]  (worker.finish)
      -> report results in lease order

The intake leases and checks the next round while the current one generates, and the post pool
works on the previous round: the GPU waits on neither. While rank 0 waits for work or for the pool,
it keeps its followers alive with Idle.

Any exception while handling a task fails that task with an error envelope and the loop goes on; a
CollectiveError propagates and the process exits (see worker.distributed). So does Unhealthy, when
the safety guard sees a run of corrupt outputs or check failures: the supervisor restarts the group.
No image is stored unless both checks ran on it and passed (or were switched off by config).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from importlib import metadata

from safety.guard import Guard
from safety.verdicts import CheckFailed
from scheduler.protocol import DeviceInfo, Lease, RegisterWorker, Report
from worker import lockstep, parallel
from worker.config import WorkerConfig
from worker.distributed import DistContext, broadcast
from worker.engine import Engine, peak_memory_mb
from worker.finish import Done, Finisher, failure
from worker.heartbeat import HeartbeatThread, WorkerState
from worker.intake import Admitted, Intake
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


class Unhealthy(RuntimeError):
    """Outputs or checks keep failing: the device or a model is broken. Exit and be restarted."""


class Coordinator:
    def __init__(self, cfg: WorkerConfig, ctx: DistContext, client: QueueClient, store: Store,
                 guard: Guard, quarantine: Store | None = None) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.client = client
        self.guard = guard
        self.state = WorkerState()
        self.state.warnings = list(guard.warnings)
        self.finisher = Finisher(cfg, guard, store, quarantine, self.state)
        self._post = ThreadPoolExecutor(cfg.storage.workers, thread_name_prefix="post")
        self._pending: deque[tuple[Lease, Future]] = deque()  # generated, in lease order
        # Rank 0 never makes followers wait longer than this without a command.
        self._keepalive_s = cfg.distributed.serve_timeout_s / 4
        self.worker_id = ""
        self._devices: list[DeviceInfo] = []
        self._heartbeat: HeartbeatThread | None = None
        self._capacity = parallel.capacity(cfg.batch.max_size, ctx.world_size, cfg.parallel.mode)
        self.intake = Intake(self._lease, self._admit, target=self._capacity)
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
            log.info("draining: no new leases; finishing the tasks held")
            self.state.set_status("draining")
            self._stop.set()
            self.intake.stop()

    def serve(self, engine: Engine) -> None:
        self.state.set_counter("images_generated", engine.generations)  # warm-up included
        self.state.set_status("ready")
        self.intake.start()
        try:
            while not (self._stop.is_set() and self.intake.drained()):
                self._turn(engine)
                if reason := self.guard.unhealthy():
                    self._settle(limit=0)
                    self._release_backlog(reason)
                    broadcast(lockstep.Shutdown(f"unhealthy: {reason}"), self.ctx)
                    raise Unhealthy(reason)
            self._settle(limit=0)
            broadcast(lockstep.Shutdown("drained"), self.ctx)
        finally:
            self._post.shutdown(wait=False, cancel_futures=True)
            if self._heartbeat:
                self._heartbeat.stop()

    def _turn(self, engine: Engine) -> None:
        self._settle(limit=self.cfg.storage.max_pending - self._capacity)
        batch = self.cfg.batch
        round_ = self.intake.take(self._capacity, batch.window_s, wait_s=self._keepalive_s)
        if not round_:
            broadcast(lockstep.Idle(), self.ctx)
            return
        jobs = [a.job for a in round_]
        t0 = time.perf_counter()
        broadcast(lockstep.Generate(tuple(jobs)), self.ctx)
        sent_ms = (time.perf_counter() - t0) * 1e3
        outs = lockstep.generate(engine, jobs, self.ctx, self.cfg.parallel.mode)
        self.state.set_counter("images_generated", engine.generations)
        self.state.set_counter("peak_memory_mb", peak_memory_mb(self.ctx.device))
        for admitted, out in zip(round_, outs):
            self._finish(admitted, out, sent_ms)

    def _finish(self, admitted: Admitted, out: lockstep.Outcome, sent_ms: float) -> None:
        """Hands a generated job to the post pool (checks, encode, store); reported by _settle."""
        lease = admitted.lease
        if out.errors:
            self._fail(lease, "generation_failed", "; ".join(out.errors), retryable=True)
            return
        out.timings = {**admitted.timings, "broadcast": sent_ms, **out.timings}
        future = self._post.submit(self.finisher.run, lease, admitted.job, out)
        future.add_done_callback(lambda _: self.intake.nudge())  # report it without waiting for work
        self._pending.append((lease, future))

    def _settle(self, limit: int) -> None:
        """Reports finished post-processing in lease order, and waits until at most `limit` tasks
        are pending, sending Idle to the followers while it waits."""
        while self._pending:
            lease, future = self._pending[0]
            if not future.done():
                if len(self._pending) <= limit:
                    return
                if not wait([future], timeout=self._keepalive_s).done:
                    broadcast(lockstep.Idle(), self.ctx)
                continue
            self._pending.popleft()
            self._report_done(lease, future)

    def _report_done(self, lease: Lease, future: Future) -> None:
        try:
            done: Done = future.result()
        except Exception as e:  # a bug in the post stage: fail the task, keep serving
            log.exception("task %s: post-processing failed", lease.task_id)
            done = failure("internal_error", f"{type(e).__name__}: {e}", retryable=True)
        self._deliver_done(lease, done)

    def _release_backlog(self, reason: str) -> None:
        """Leased but never started: hand back at once rather than at lease expiry."""
        q = self.cfg.queue
        left = self.intake.close(join_s=q.lease_wait_s + q.timeout_s)
        if left:
            log.warning("releasing %d task(s) never started: %s", len(left), reason)
        for admitted in left:
            self._deliver(admitted.lease, Report(worker_id=self.worker_id, lease_token=admitted.lease.lease_token,
                                                 status="released"))

    # ------------------------------------------------------------ stages

    def _lease(self, n: int) -> list[Lease]:
        """On the intake thread. Up to n leases; [] after an error it has waited out."""
        if self.state.worker_unknown.is_set():
            self.state.worker_unknown.clear()
            self.register(self._devices)
        try:
            leases = self.client.lease(self.worker_id, min(n, self.cfg.queue.max_tasks), self.cfg.queue.lease_wait_s)
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

    def _admit(self, lease: Lease, timings: dict[str, float]) -> Job | None:
        """On the intake thread: validate -> text check -> report processing. None: the task was
        failed (and reported) or dropped."""
        try:
            job = self._validate(lease)
        except InvalidRequest as e:
            self._fail(lease, "invalid_request", str(e), retryable=False)
            return None
        t0 = time.perf_counter()
        allowed = self._prompt_allowed(lease, job)
        t1 = time.perf_counter()
        timings["text_check"] = (t1 - t0) * 1e3
        if not allowed:
            return None
        try:
            self._report(lease, "processing")
        except QueueError as e:  # lease lost (409) or the report could not be delivered
            log.warning("task %s dropped before generation: %s", lease.task_id, e)
            self.state.end(lease.task_id)
            return None
        timings["admit"] = (time.perf_counter() - t1) * 1e3
        return job

    def _validate(self, lease: Lease) -> Job:
        job = validate_task(lease.task_id, lease.input, self.cfg.limits)
        if job.seed is None:
            job = job.model_copy(update={"seed": default_seed(job.task_id)})
        if self.cfg.parallel.mode == "context" and self.ctx.world_size > 1:
            if why := parallel.sequence_fits(job.width, job.height, self.cfg.model.max_sequence_length,
                                             self.ctx.world_size):
                raise InvalidRequest(why)
        return job

    def _prompt_allowed(self, lease: Lease, job: Job) -> bool:
        """The text check, before any GPU work. A refusal is final; a failing check is retryable."""
        try:
            verdict = self.guard.screen_prompt(job.prompt)
        except CheckFailed as e:
            self._fail(lease, "safety_check_failed", str(e), retryable=True)
            return False
        if verdict is None or not verdict.refused:
            return True
        self.state.count("prompts_refused")
        self._fail(lease, "unsafe_prompt", f"prompt refused: {verdict.describe()}", retryable=False,
                   details=verdict.details())
        return False


    # ------------------------------------------------------------ reporting

    def _fail(self, lease: Lease, code: str, message: str, *, retryable: bool,
              details: dict | None = None) -> None:
        self._deliver_done(lease, failure(code, message, retryable=retryable, details=details))

    def _deliver_done(self, lease: Lease, done: Done) -> None:
        if done.error is not None:
            log.info("task %s failed: %s: %s", lease.task_id, done.error.code, done.error.message)
            error = done.error.model_copy(update={"worker_id": self.worker_id})
            rep = Report(worker_id=self.worker_id, lease_token=lease.lease_token, status="failed", error=error)
        elif done.result is not None:
            rep = Report(worker_id=self.worker_id, lease_token=lease.lease_token, status="succeeded",
                         result=done.result)
        else:  # lease lost: a newer attempt reports
            self.state.end(lease.task_id)
            return
        self._deliver(lease, rep)

    def _deliver(self, lease: Lease, rep: Report) -> None:
        """Final report. If it cannot be delivered, the lease expires and the task is retried; the
        object name is derived from the task id, so the retry cannot leave a second object."""
        t0 = time.perf_counter()
        try:
            self.client.report(lease.task_id, rep, deadline_s=self.cfg.queue.report_deadline_s)
        except LeaseLost as e:
            log.warning("task %s: lease lost, result not reported: %s", lease.task_id, e)
        except QueueError as e:
            log.error("task %s: report undeliverable, lease will expire: %s", lease.task_id, e)
        else:
            self.state.count(f"tasks_{rep.status}")
            self.state.count("report_us_total", int((time.perf_counter() - t0) * 1e6))
            self.state.count("reports")
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
