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

from protocol import DeviceInfo
from safety.verdicts import SafetyLoadError
from telemetry import logs
from worker.config import ConfigError, load_config
from worker.model import speed
from worker.model.engine import Engine
from worker.ranks import distributed, lockstep
from worker.serving.coordinator import Coordinator, Unhealthy
from worker.serving.registration import FatalQueueError
from worker.storage import StorageConfigError

log = logging.getLogger("worker")

# The rank that talks to the world (queue, heartbeat, checks, storage, reports), decided here and
# nowhere else: the distributed context carries it to every collective.
COORDINATOR_RANK = 0


def run(config_path: str, overrides: list[str] = ()) -> int:
    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    logs.configure(cfg.logging.level, cfg.logging.format, rank=int(os.environ.get("RANK", "0")))
    try:
        ctx = distributed.init_distributed(cfg.distributed, cfg.model.device, COORDINATOR_RANK, cfg.model.dtype)
    except ConfigError as e:
        log.critical("not starting: %s", e)
        return 2
    try:
        speed.check(cfg.speed, cfg.parallel, ctx.device, ctx.world_size)  # every rank, before registering
        coordinator = Coordinator.build(cfg, ctx) if ctx.is_coordinator else None
    except (ConfigError, SafetyLoadError, StorageConfigError, speed.SpeedConfigError) as e:
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


def _handle_signals(coordinator: Coordinator | None) -> None:
    def on_signal(signum, _frame):
        if coordinator is None:
            return  # followers stop when the coordinator broadcasts Shutdown
        if coordinator.draining:
            os._exit(128 + signum)  # second signal: stop now; leases expire and tasks are retried
        coordinator.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def _describe(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        # The UUID lets rank 0 find this GPU in NVML (temperature, power, clocks) when on its host.
        return DeviceInfo(name=props.name, memory_bytes=props.total_memory, uuid=str(props.uuid))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceInfo(name=f"cpu ({platform.machine()})", memory_bytes=memory)
