"""The worker process: config -> distributed setup -> register -> load -> warm up -> serve.

Launched once per rank by torchrun:  torchrun --nproc_per_node=N -m worker --config configs/X.toml
"""

from __future__ import annotations

import logging
import os
import platform
import signal
import sys

import torch

from safety.guard import Guard
from safety.verdicts import SafetyLoadError
from scheduler.protocol import DeviceInfo
from worker import distributed, lockstep, speed
from worker.config import ConfigError, WorkerConfig, load_config
from worker.engine import Engine
from worker.queue_client import QueueClient
from worker.serve import Coordinator, FatalQueueError, Unhealthy
from worker.storage import StorageConfigError, build_store

log = logging.getLogger("worker")


def run(config_path: str, overrides: list[str] = ()) -> int:
    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    _setup_logging(cfg.logging.level, rank=int(os.environ.get("RANK", "0")))
    ctx = distributed.init_distributed(cfg.distributed, cfg.model.device)
    # Rank-0-only work is decided here and nowhere else: queue, heartbeat, storage, safety, reports.
    try:
        speed.check(cfg.speed, cfg.parallel, ctx.device, ctx.world_size)  # every rank, before registering
        coordinator = _build_coordinator(cfg, ctx) if ctx.is_coordinator else None
    except (SafetyLoadError, StorageConfigError, speed.SpeedConfigError) as e:
        # Fail closed: never register, never serve unchecked or undeliverable. torchrun stops the
        # other ranks.
        log.critical("not starting: %s", e)
        return 2
    _handle_signals(coordinator)
    try:
        devices = distributed.all_gather(_describe(ctx.device), ctx)
        if coordinator:
            coordinator.register(devices)
        engine = Engine.load(cfg.model, ctx.device, cfg.speed, cfg.parallel, ctx.world_size)
        lockstep.warm_up(engine, cfg.warmup.sizes, range(1, cfg.batch.max_size + 1), cfg.warmup.prompt,
                         cfg.limits.default_steps, ctx, cfg.parallel.mode)
        distributed.enter_serving(ctx, cfg.distributed)
        if coordinator:
            coordinator.serve(engine)
        else:
            log.info("follower stopped: %s", lockstep.follow(engine, ctx, cfg.parallel.mode))
    except distributed.CollectiveError as e:
        # Peers may be stuck in the collective: exit at once, torchrun restarts the group.
        log.critical("%s; exiting so the group is restarted", e)
        return 1
    except FatalQueueError as e:
        log.critical("scheduler refused this worker: %s", e)
        return 3
    except Unhealthy as e:
        # The followers have been told to stop; a non-zero exit makes torchrun restart the group.
        log.critical("unhealthy: %s; exiting for a restart", e)
        distributed.close(ctx)
        return 4
    distributed.close(ctx)
    return 0


def _build_coordinator(cfg: WorkerConfig, ctx: distributed.DistContext) -> Coordinator:
    store = build_store(cfg.storage)
    store.check_writable()  # before loading a model we could not deliver from
    quarantine = build_store(cfg.storage.quarantine) if cfg.storage.quarantine else None
    if quarantine:
        quarantine.check_writable()
    guard = Guard.load(cfg.safety)  # before registering: a worker that cannot check is never ready
    token = os.environ.get(cfg.queue.token_env) or None
    return Coordinator(cfg, ctx, QueueClient(cfg.queue, token), store, guard, quarantine)


def _handle_signals(coordinator: Coordinator | None) -> None:
    def on_signal(signum, _frame):
        if coordinator is None:
            return  # followers stop when rank 0 broadcasts Shutdown
        if coordinator.state.status == "draining":
            os._exit(128 + signum)  # second signal: stop now; leases expire and tasks are retried
        coordinator.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def _describe(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return DeviceInfo(name=props.name, memory_bytes=props.total_memory)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceInfo(name=f"cpu ({platform.machine()})", memory_bytes=memory)


def _setup_logging(level: str, rank: int) -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    # Libraries log progress bars and chatter at INFO; keep the worker's own lines readable.
    for noisy in ("httpx", "httpcore", "diffusers", "transformers", "urllib3", "onnxruntime"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
