"""Rank 0's serve loop. Each turn: report what the post stage finished (in lease order), take a
round of admitted tasks, broadcast it, generate in lockstep, hand the images to the post stage.

    [intake thread: lease -> admission (validate, text check, report processing)]   intake, admission
      -> take a round: one batch per rank -> broadcast -> generate (all ranks)        rounds, ranks.lockstep
      -> [post pool: quality check -> image check -> encode -> store]                 post
      -> report results in lease order                                                reporter

The intake admits the next round while the current one generates, and the post pool works on the
previous round: the GPU waits on neither. While rank 0 waits for work or for the pool, it keeps its
followers alive with Idle. A CollectiveError propagates and the process exits (ranks.distributed);
so does Unhealthy, when the safety guard sees a run of corrupt outputs or check failures.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from protocol import DeviceInfo, ErrorCode
from safety.guard import Guard
from worker.config import WorkerConfig
from worker.model.engine import Engine, peak_memory_mb
from worker.model.parallel import context_parallel
from worker.ranks import lockstep
from worker.ranks.distributed import DistContext, broadcast
from worker.serving.admission import Admission
from worker.serving.heartbeat import WorkerState
from worker.serving.intake import Intake
from worker.serving.leasing import Leaser
from worker.serving.metrics import Metrics
from worker.serving.ops import Health, OpsServer
from worker.serving.post import PostStage
from worker.serving.queue_client import QueueClient
from worker.serving import sizing
from worker.serving.registration import Registration
from worker.serving.reporter import Reporter
from worker.serving.sizing import Sizes
from worker.serving.task import Task
from worker.serving.validation import advertised
from worker.serving.watchdog import Watchdog
from worker.storage import build_store

log = logging.getLogger(__name__)


class Unhealthy(RuntimeError):
    """Outputs or checks keep failing: the device or a model is broken. Exit and be restarted."""


class Coordinator:
    def __init__(self, cfg: WorkerConfig, ctx: DistContext, sizes: Sizes, client: QueueClient, guard: Guard,
                 post: PostStage, state: WorkerState, metrics: Metrics) -> None:
        self.ctx = ctx
        self.queue_url = cfg.queue.url  # named in every message about the scheduler
        self.metrics = metrics
        self.guard = guard
        self.state = state
        self.post = post
        self.sizes = sizes
        self._window_s = cfg.batch.window_s
        self._mode = cfg.parallel.mode
        # Rank 0 never makes followers wait longer than this without a command.
        self._keepalive_s = cfg.distributed.serve_timeout_s / 4
        # How long one wait (for work, for the post stage) lasts before the loop looks again: short
        # enough that a turn, waits included, ends well within deadlines.stall_s.
        d = cfg.deadlines
        self._wait_s = min(self._keepalive_s, (d.stall_s - d.generate_s - d.check_s - d.encode_s - d.store_s) / 3)
        self._release_wait_s = cfg.queue.lease_wait_s + cfg.queue.timeout_s
        self._stop = threading.Event()
        health = Health(state, cfg.deadlines.stall_s, cfg.distributed.load_timeout_s, self._stop.is_set)
        self.ops = OpsServer(cfg.ops, metrics, health) if cfg.ops.enabled else None
        self._gpu_metrics = cfg.ops.enabled and cfg.ops.gpu_metrics
        self.registration = Registration(client, self.state, cfg.queue.heartbeat_interval_s, ctx.world_size,
                                         cfg.model.name, ctx.node_id, advertised(cfg.limits))
        self.reporter = Reporter(client, lambda: self.registration.worker_id, self.state,
                                 cfg.queue.report_deadline_s, metrics, discard=post.discard)
        context = context_parallel(cfg.parallel, ctx.world_size)
        self._deadlines = cfg.deadlines
        self.watchdog = Watchdog(self.state, self.reporter, cfg.deadlines)
        admission = Admission(cfg.limits, guard, self.reporter, self.state, cfg.deadlines,
                              context_ranks=ctx.world_size if context else 0,
                              text_tokens=cfg.model.max_sequence_length)
        leaser = Leaser(client, self.registration, self.state, cfg.queue, self._stop)
        self.intake = Intake(leaser, admission, target=sizes.lease_ahead)
        # Visible in GET /v1/workers: how much this worker may hold.
        state.set_counter("lease_ahead", sizes.lease_ahead)
        state.set_counter("max_pending", sizes.max_pending)

    @classmethod
    def build(cls, cfg: WorkerConfig, ctx: DistContext) -> "Coordinator":
        """Everything rank 0 needs, checked before the worker registers: sizes that fit the group, a
        store it can write to, a quarantine apart from it, safety checks that load and pass their
        self-test. Raises ConfigError naming the field when the config cannot work on this group."""
        sizes = sizing.size(cfg, ctx.world_size)
        store = build_store(cfg.storage)
        store.check_writable()  # before loading a model we could not deliver from
        quarantine = build_store(cfg.storage.quarantine) if cfg.storage.quarantine else None
        if quarantine:
            quarantine.check_writable()
        guard = Guard.load(cfg.safety)  # before registering: a worker that cannot check is never ready
        token = os.environ.get(cfg.queue.token_env) or None
        state = WorkerState(warnings=guard.warnings, safety_policy=guard.policy_version)
        gcs = cfg.storage.gcs
        post = PostStage(guard, store, quarantine, state, cfg.encode, cfg.model.name,
                         include_prompt=bool(gcs and gcs.include_prompt), workers=sizes.post_workers,
                         deadlines=cfg.deadlines)
        log.info("round %d image(s) (%d slot(s) x batch %d); lease ahead %d; post pool %d thread(s), "
                 "at most %d unreported", sizes.round, sizes.slots, sizes.per_slot, sizes.lease_ahead,
                 sizes.post_workers, sizes.max_pending)
        coordinator = cls(cfg, ctx, sizes, QueueClient(cfg.queue, token), guard, post, state,
                          Metrics(state, ctx.device))
        if coordinator.ops is not None:  # now, so that liveness is answered while the model loads
            coordinator.registration.ops_url = coordinator.ops.start()
        return coordinator

    # ------------------------------------------------------------ lifecycle

    def register(self, devices: list[DeviceInfo]) -> None:
        if self._gpu_metrics:
            self.metrics.watch_gpus(devices)
        self.registration.register(devices, interrupt=self._stop)  # a stop signal ends its retries

    @property
    def draining(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Graceful drain: stop leasing, finish what is held, then shut the followers down."""
        if not self._stop.is_set():
            log.info("draining: no new leases; finishing the tasks held")
            self.state.set_status("draining")
            self._stop.set()
            self.intake.stop()

    def serve(self, engine: Engine) -> None:
        self.state.count("images_generated", 0)  # listed from the first heartbeat on
        self.state.set_status("ready")
        self.state.progress()
        self.intake.start()
        self.watchdog.start()
        try:
            while not (self._stop.is_set() and self.intake.drained()):
                self._turn(engine)
                self.state.progress()
                if reason := self.guard.unhealthy():
                    self._stop_unhealthy(reason)
            self.reporter.settle(0, self._keepalive, self._wait_s)
            broadcast(lockstep.Shutdown("drained"), self.ctx)
            # Everything held is reported: the scheduler shows this worker `drained`, not `lost`, once
            # its heartbeats stop. Only here: a worker that ends any other way is a crash to it.
            self.registration.leave()
        finally:
            self.watchdog.stop()
            self.post.shutdown()
            self.registration.close()
            if self.ops is not None:
                self.ops.stop()

    # ------------------------------------------------------------ one turn

    def _turn(self, engine: Engine) -> None:
        # Room for this round in the post stage: at most max_pending unreported once it is handed over.
        t0 = time.perf_counter()
        self.reporter.settle(self.sizes.max_pending - self.sizes.round, self._keepalive, self._wait_s)
        settle_ms = (time.perf_counter() - t0) * 1e3
        for task in self.intake.withdraw(self.state.is_cancelled):  # never started: nothing to discard
            self.reporter.cancelled(task, "before it started")
        batches = self.intake.take(self.sizes.slots, self.sizes.per_slot, self._window_s, wait_s=self._wait_s)
        if not batches:
            self._keepalive()
            return
        round_ = [task for batch in batches for task in batch]
        for task, out in zip(round_, self._generate(engine, batches)):
            if out.errors:
                self.reporter.fail(task, ErrorCode.GENERATION_FAILED, "; ".join(out.errors), retryable=True)
                continue
            task.timings.record(settle=settle_ms, **out.timings)
            post = self.post.submit(task, out)
            post.add_done_callback(lambda _: self.intake.nudge())  # report it without waiting for work
            self.reporter.track(task, post)
        self.state.raise_counter("unreported_max", self.reporter.pending)

    def _generate(self, engine: Engine, batches: list[list[Task]]) -> list[lockstep.Outcome]:
        jobs = tuple(tuple(t.job for t in batch) for batch in batches)
        self.metrics.round_generated(len(batch) for batch in batches)
        for batch in batches:
            for task in batch:
                self.state.stage(task, "generate", self._deadlines.generate_s)
        t0 = time.perf_counter()
        broadcast(lockstep.Generate(jobs), self.ctx)
        sent_ms = (time.perf_counter() - t0) * 1e3
        for batch in batches:
            for task in batch:
                task.timings.record(broadcast=sent_ms)
        outs = lockstep.generate(engine, jobs, self.ctx, self._mode)
        # Every rank's images for tasks: rank 0's engine counts only its own, warm-up included.
        self.state.count("images_generated", sum(not out.errors for out in outs))
        self.state.set_counter("peak_memory_mb", peak_memory_mb(self.ctx.device))
        return outs

    def _keepalive(self) -> None:
        broadcast(lockstep.Idle(), self.ctx)

    def _stop_unhealthy(self, reason: str) -> None:
        """Reports what is finished, hands back what never started, stops the followers, raises."""
        self.reporter.settle(0, self._keepalive, self._wait_s)
        left = self.intake.close(join_s=self._release_wait_s)
        if left:
            log.warning("releasing %d task(s) never started: %s", len(left), reason)
        for task in left:
            self.reporter.release(task)
        broadcast(lockstep.Shutdown(f"unhealthy: {reason}"), self.ctx)
        raise Unhealthy(reason)
