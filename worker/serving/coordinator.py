"""Rank 0's serve loop. Each turn: report what the post stage finished (in lease order), take a
round of admitted tasks, broadcast it, generate in lockstep, hand the images to the post stage.

    [intake thread: lease -> admission (validate, text check, report processing)]   intake, admission
      -> take a round: one batch per rank -> broadcast -> generate (all ranks)        rounds, ranks.lockstep
      -> [post pool: quality check -> image check -> encode -> store]                 post
      -> report results in lease order                                                backlog, reporter

The intake admits the next round while the current one generates, and the post pool works on the
previous round: the GPU waits on neither. Before each round the loop waits until the post stage has
room for it (its `settle` time): the tasks it holds, their stages and fates are the ledger's. While
rank 0 waits for work or for the pool, it keeps its followers alive with Idle. A CollectiveError
propagates and the process exits (ranks.distributed); so does Unhealthy, when the safety guard sees
a run of corrupt outputs or check failures. worker.serving.assembly builds it from the config.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from protocol import DeviceInfo, ErrorCode, RegistrationStatus
from safety.guard import Guard
from worker.config import WorkerConfig
from worker.model.resident import Resident, weights_mb
from worker.ranks import lockstep
from worker.ranks.distributed import DistContext, broadcast
from worker.serving.adapter_sets import HeldSets
from worker.serving.backlog import Backlog
from worker.serving.generation import generate_round
from worker.serving.intake import Intake
from worker.serving.ledger import Counter, Ledger, Stage
from worker.serving.metrics import Metrics
from worker.serving.ops import OpsServer
from worker.serving.post import PostStage
from worker.serving.profiling import Profiler
from worker.serving.registration import Registration
from worker.serving.reporter import Reporter
from worker.serving.sizing import Sizes
from worker.serving.state import WorkerState
from worker.serving.swapping import Models
from worker.serving.task import Task
from worker.serving.watchdog import Watchdog

log = logging.getLogger(__name__)


class Unhealthy(RuntimeError):
    """Outputs or checks keep failing: the device or a model is broken. Exit and be restarted."""


@dataclass(eq=False)
class Coordinator:
    cfg: WorkerConfig
    ctx: DistContext
    sizes: Sizes
    guard: Guard
    state: WorkerState
    ledger: Ledger
    metrics: Metrics
    post: PostStage
    registration: Registration
    reporter: Reporter
    backlog: Backlog
    intake: Intake
    watchdog: Watchdog
    stop: threading.Event  # set: draining (no new leases)
    models: Models  # which models it holds and can load, and each swap's decision
    ops: OpsServer | None = None
    profiler: Profiler | None = None  # POST /profile on the ops endpoint arms it (serving.profiling)

    def __post_init__(self) -> None:
        self._keepalive_s = self.cfg.distributed.serve_timeout_s / 4  # the longest followers wait for a command
        # One wait (for work, for the post stage): short enough that a turn ends well within stall_s.
        d = self.cfg.deadlines
        self._wait_s = min(self._keepalive_s, (d.stall_s - d.generate_s - d.check_s - d.encode_s - d.store_s) / 3)
        # Visible in GET /v1/workers: how much this worker may hold.
        self.ledger.counters.set(Counter.LEASE_AHEAD, self.sizes.lease_ahead)
        self.ledger.counters.set(Counter.MAX_PENDING, self.sizes.max_pending)
        self._swap = SwapTurn(self.ctx, self.models, self.ledger, self.state, self.metrics, self.reporter,
                              self.intake, self.cfg.deadlines.swap_s)
        self._adapter_sets = HeldSets()  # the sets of adapters the scheduler may route to it

    # ------------------------------------------------------------ lifecycle

    def register(self, devices: list[DeviceInfo]) -> None:
        if self.cfg.ops.enabled and self.cfg.ops.gpu_metrics:
            self.metrics.watch_gpus(devices)
        self.registration.register(devices, interrupt=self.stop)  # a stop signal ends its retries

    @property
    def draining(self) -> bool:
        return self.stop.is_set()

    def request_stop(self) -> None:
        """Graceful drain: stop leasing, finish what is held, then shut the followers down."""
        if not self.stop.is_set():
            log.info("draining: no new leases; finishing the tasks held")
            self.state.set_status(RegistrationStatus.DRAINING)
            self.stop.set()
            self.intake.stop()

    def serve(self, resident: Resident) -> None:
        self.ledger.counters.add(Counter.IMAGES_GENERATED, 0)  # listed from the first heartbeat on
        for name in resident.names():  # loaded and warmed up at start
            self.models.loaded(name, (), weights_mb(resident.engine(name)))
        self.state.set_status(RegistrationStatus.READY)
        self.state.progress()
        self.intake.start()
        self.watchdog.start()
        try:
            while not (self.stop.is_set() and self.intake.drained()):
                self._turn(resident)
                self.state.progress()
                if reason := self.guard.unhealthy():
                    self._stop_unhealthy(reason)
            self.backlog.report_down_to(0, self._keepalive, self._wait_s)
            broadcast(lockstep.Shutdown("drained"), self.ctx)
            # Everything held is reported: the scheduler shows this worker `drained`, not `lost`, once
            # its heartbeats stop. Only here: a worker that ends any other way is a crash to it.
            self.registration.leave()
        finally:
            self.watchdog.stop()
            self.post.shutdown()
            self.registration.close()
            if self.ops is not None:
                self.ops.stop()  # and stops a trace under way, which keeps what it has

    # ------------------------------------------------------------ one turn

    def _turn(self, resident: Resident) -> None:
        # Room for this round in the post stage: at most max_pending unreported once it is handed over.
        t0 = time.perf_counter()
        self.backlog.report_down_to(self.sizes.max_pending - self.sizes.round, self._keepalive, self._wait_s)
        settle_ms = (time.perf_counter() - t0) * 1e3
        for task in self.intake.withdraw(self.ledger.cancelled):  # never started: nothing to discard
            self.reporter.cancelled(task, "before it started")
        batches = self.intake.take(self.sizes.slots, self.sizes.per_slot, self.cfg.batch.window_s, wait_s=self._wait_s)
        if not batches:
            self._keepalive()
            return
        round_ = [task for batch in batches for task in batch]
        model = round_[0].model or self.models.first
        if model not in resident.engines and not self._swap(resident, model, round_):
            return
        self.models.used(model)
        outs = generate_round(resident.engine(model), batches, self.ctx, self.cfg.parallel.mode, self.sizes.per_slot,
                              self.ledger, self.metrics, self.profiler, resident.adapter_files)
        self._adapter_sets.after(round_, resident.engine(model), self.state)
        for task, out in zip(round_, outs):
            if out.errors:
                self.reporter.fail(task, **_generation_failure(out.errors))
                continue
            task.timings.record(settle=settle_ms, **out.timings)
            post = self.post.submit(task, out)
            post.add_done_callback(lambda _: self.intake.nudge())  # report it without waiting for work
            self.backlog.add(task, post)
        self.ledger.counters.high_water(Counter.UNREPORTED_MAX, len(self.backlog))

    def _keepalive(self) -> None:
        broadcast(lockstep.Idle(), self.ctx)

    def _stop_unhealthy(self, reason: str) -> None:
        """Reports what is finished, hands back what never started, stops the followers, raises."""
        self.backlog.report_down_to(0, self._keepalive, self._wait_s)
        left = self.intake.close(join_s=self.cfg.queue.lease_wait_s + self.cfg.queue.timeout_s)
        if left:
            log.warning("releasing %d task(s) never started: %s", len(left), reason)
        for task in left:
            self.reporter.release(task)
        broadcast(lockstep.Shutdown(f"unhealthy: {reason}"), self.ctx)
        raise Unhealthy(reason)


def _generation_failure(errors: list[str]) -> dict:
    """How a task its round failed is reported: an adapter that fits no layer of the model is the
    task's own (invalid_request, naming the field); anything else may pass elsewhere."""
    if all("AdapterMismatch: " in e for e in errors):
        return dict(code=ErrorCode.INVALID_REQUEST, message=errors[0].split("AdapterMismatch: ", 1)[1], retryable=False)
    return dict(code=ErrorCode.GENERATION_FAILED, message="; ".join(errors), retryable=True)


@dataclass
class SwapTurn:
    """A round whose model is not resident on the ranks: the swap it needs, decided by `models`
    and run on every rank in lockstep."""

    ctx: DistContext
    models: Models
    ledger: Ledger
    state: WorkerState
    metrics: Metrics
    reporter: Reporter
    intake: Intake
    swap_s: float  # deadlines.swap_s: every rank loading is not a stalled loop

    def __call__(self, resident: Resident, model: str, round_: list[Task]) -> bool:
        """Makes `model` resident on every rank (lockstep.swap), evicting what the policy picks. False
        when its load failed: this round's tasks and every ready one of that model fail, retryable
        (another worker may load it), and it is no longer offered; the worker serves the others."""
        evict = self.models.victims(model)
        for task in round_:
            self.ledger.advance(task, Stage.SWAP)
        log.info("swap: loading %s%s", model, f", evicting {', '.join(evict)}" if evict else "")
        self.state.grant(self.swap_s)  # not a stalled loop while every rank loads
        self.models.loading(model, evict)
        t0 = time.perf_counter()
        cmd = lockstep.Swap(model, evict)
        broadcast(cmd, self.ctx)
        errors = lockstep.swap(resident, cmd, self.ctx)
        seconds = time.perf_counter() - t0
        self.metrics.swapped(model, seconds, ok=not errors)
        self.ledger.counters.add(Counter.SWAPS)
        if errors:
            why = "; ".join(errors)
            log.error("swap to %s failed in %.1fs: %s", model, seconds, why)
            self.models.failed(model, evict, why)
            for task in round_ + self.intake.withdraw(lambda t: t.model == model):
                self.reporter.fail(task, ErrorCode.MODEL_UNAVAILABLE, f"loading model {model!r} failed on this "
                                   f"worker: {why}", retryable=True)
            return False
        self.models.loaded(model, evict, weights_mb(resident.engine(model)))
        log.info("swap: %s loaded and warmed up in %.1fs", model, seconds)
        for task in round_:
            task.timings.record(swap=seconds * 1e3)
        return True
