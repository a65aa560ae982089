"""Rank 0's parts, built from the config and wired together: one ledger and one worker state that
every part shares, the checks, the stores, the post stage, the intake, the reporter, the watchdog,
the operator endpoint. Whatever cannot work is refused here, before the worker registers."""

from __future__ import annotations

import logging
import os
import threading

from safety.guard import Guard
from worker.adapters import AdapterCache
from worker.config import ConfigError, WorkerConfig
from worker.model.parallel import context_parallel
from worker.ranks.distributed import DistContext
from worker.serving import sizing
from worker.serving.admission import Admission
from worker.serving.backlog import Backlog
from worker.serving.coordinator import Coordinator
from worker.serving.intake import Intake
from worker.serving.leasing import Leaser
from worker.serving.ledger import Ledger, stage_limits
from worker.serving.metrics import Metrics
from worker.serving.ops import Health, OpsServer
from worker.serving.post import PostStage
from worker.serving.profiling import Profiler
from worker.serving.queue_client import QueueClient
from worker.serving.registration import Registration
from worker.serving.reporter import Reporter
from worker.serving.state import WorkerState
from worker.serving.swapping import Models
from worker.serving.validation import advertised
from worker.serving.watchdog import Watchdog
from worker.storage import ImageStore, build_store

log = logging.getLogger(__name__)


def build(cfg: WorkerConfig, ctx: DistContext) -> Coordinator:
    """Everything rank 0 needs, checked before the worker registers: sizes that fit the group, a
    store it can write to, a quarantine apart from it, safety checks that load and pass their
    self-test. Raises ConfigError naming the field when the config cannot work on this group."""
    sizes = sizing.size(cfg, ctx.world_size)
    store, quarantine = _stores(cfg)  # before loading a model we could not deliver from
    guard = Guard.load(cfg.safety)  # before registering: a worker that cannot check is never ready
    state = WorkerState(warnings=guard.warnings, safety_policy=guard.policy_version)
    models = Models(cfg.catalog, cfg.swap.memory_budget_mb, state)
    ledger = Ledger(stage_limits(cfg.deadlines))
    gcs = cfg.storage.gcs
    post = PostStage(guard, store, quarantine, state, ledger, cfg.encode, cfg.model.name,
                     include_prompt=bool(gcs and gcs.include_prompt), workers=sizes.post_workers)
    log.info("round %d image(s) (%d slot(s) x batch %d); lease ahead %d; post pool %d thread(s), "
             "at most %d unreported", sizes.round, sizes.slots, sizes.per_slot, sizes.lease_ahead,
             sizes.post_workers, sizes.max_pending)
    client = QueueClient(cfg.queue, os.environ.get(cfg.queue.token_env) or None)
    metrics = Metrics(state, ledger, ctx.device)
    stop = threading.Event()
    registration = Registration(client, state, ledger, cfg.queue.heartbeat_interval_s, ctx.world_size,
                                cfg.model.name, ctx.node_id, advertised(cfg.limits, cfg.lora))
    reporter = Reporter(client, lambda: registration.worker_id, ledger, cfg.queue.report_deadline_s, metrics,
                        discard=post.discard,
                        exchange_hold_s=cfg.queue.lease_hold_s if cfg.queue.exchange else None)
    exchanger = reporter.delivery.exchanger
    admission = Admission(cfg.limits, guard, reporter, ledger,
                          context_ranks=ctx.world_size if context_parallel(cfg.parallel, ctx.world_size) else 0,
                          text_tokens=cfg.model.max_sequence_length, models=models,
                          model_limits={name: cfg.limits_of(name) for name in cfg.models},
                          model_text_tokens={name: m.max_sequence_length for name, m in cfg.models.items()},
                          lora=cfg.lora, adapters=_adapter_cache(cfg))
    intake = Intake(Leaser(client, registration, state, cfg.queue, stop, exchanger), admission,
                    target=sizes.lease_ahead, round_=sizes.round)
    admission.on_ready = intake.add  # a task whose adapters took a download joins the ready ones then
    ops = profiler = None
    if cfg.ops.enabled:  # started now, so that liveness is answered while the model loads
        health = Health(state, cfg.deadlines.stall_s, cfg.distributed.load_timeout_s, stop.is_set)
        profiler = Profiler(cfg.ops.profile_dir, ctx.device) if cfg.ops.profile_dir else None
        ops = OpsServer(cfg.ops, metrics, health, profiler)
        registration.ops_url = ops.start()
    return Coordinator(cfg, ctx, sizes, guard, state, ledger, metrics, post, registration, reporter,
                       Backlog(reporter, ledger), intake, Watchdog(state, ledger, reporter, cfg.deadlines.stall_s),
                       stop, models, ops, profiler)


def _adapter_cache(cfg: WorkerConfig) -> AdapterCache | None:
    """The node's adapter cache, made now (a config error names lora.cache_dir); None: no adapters."""
    if not cfg.lora.accepted:
        return None
    cache = AdapterCache(cfg.lora)
    try:
        cache.open()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cache


def _stores(cfg: WorkerConfig) -> tuple[ImageStore, ImageStore | None]:
    """The results store and the quarantine (None: not kept), each checked writable."""
    store = build_store(cfg.storage)
    store.check_writable()
    quarantine = build_store(cfg.storage.quarantine) if cfg.storage.quarantine else None
    if quarantine:
        quarantine.check_writable()
    return store, quarantine
