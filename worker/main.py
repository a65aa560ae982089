"""The worker process: config -> distributed setup -> register -> load -> warm up -> serve.

Launched once per rank by torchrun:  torchrun --nproc_per_node=N -m worker --config configs/X.toml
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import signal
import sys
import time

import torch

from protocol import DeviceInfo
from safety.verdicts import SafetyLoadError
from telemetry import logs
from worker.config import ConfigError, load_config
from worker.model import speed
from worker.nodedir import NodeDir
from worker.ranks import distributed, lockstep
from worker.serving import assembly
from worker.serving.coordinator import Coordinator, Unhealthy
from worker.serving.queue_client import Interrupted, Unavailable
from worker.serving.registration import REGISTER_DEADLINE_S, FatalQueueError
from worker.storage import StorageConfigError

log = logging.getLogger("worker")

# The rank that talks to the world (queue, heartbeat, checks, storage, reports), decided here and
# nowhere else: the distributed context carries it to every collective.
COORDINATOR_RANK = 0


# Start errors that no restart can cure: the node stops instead of looping (worker/nodedir.py).
PERMANENT = (ConfigError, SafetyLoadError, StorageConfigError, speed.SpeedConfigError)
EXIT_PERMANENT = 2
EXIT_REFUSED = 3


def run(config_path: str, overrides: list[str] = (), node_dir: str | None = None) -> int:
    node = NodeDir(node_dir) if node_dir else None
    if node and (reason := _ended(node)):
        print(f"not starting: {reason}", file=sys.stderr)
        return 0  # every rank of this group does the same, so torchrun ends instead of restarting
    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return _permanent(node, EXIT_PERMANENT, f"config error: {e}")
    logs.configure(cfg.logging.level, cfg.logging.format, rank=int(os.environ.get("RANK", "0")))
    logs.route_library_logs()
    try:
        ctx = distributed.init_distributed(cfg.distributed, cfg.model.device, COORDINATOR_RANK, cfg.model.dtype)
        for name in cfg.catalog:  # every rank, every model it may load, before registering
            speed.check(cfg.speed_of(name), cfg.parallel, ctx.device, ctx.world_size)
        coordinator = assembly.build(cfg, ctx) if ctx.is_coordinator else None
    except PERMANENT as e:
        # Fail closed: never register, never serve unchecked or undeliverable. torchrun stops the
        # other ranks.
        log.critical("not starting: %s", e)
        return _permanent(node, EXIT_PERMANENT, f"not starting: {e}")
    StopSignals(coordinator).install()
    try:
        devices = distributed.all_gather(_describe(ctx.device), ctx)
        start = distributed.broadcast(_register(coordinator, node, devices), ctx)  # rank 0 decides for all
        if start != SERVE:
            return _left_before_serving(start, node, ctx)
        resident = lockstep.start_models(cfg, ctx)  # [model], loaded and warmed up on every rank
        _started()
        distributed.enter_serving(ctx, cfg.distributed)
        if coordinator:
            coordinator.serve(resident)
            if node:
                node.record_drained()
        else:
            log.info("follower stopped: %s", lockstep.follow(resident, ctx, cfg.parallel.mode))
    except distributed.CollectiveError as e:
        # Peers may be stuck in the collective: exit at once, torchrun restarts the group.
        log.critical("%s; exiting so the group is restarted", e)
        return 1
    except FatalQueueError as e:
        log.critical("scheduler refused this worker: %s", e)
        return _permanent(node, EXIT_REFUSED, f"scheduler refused this worker: {e}")
    except Unhealthy as e:
        # The followers have been told to stop; a non-zero exit makes torchrun restart the group.
        log.critical("unhealthy: %s; exiting for a restart", e)
        distributed.close(ctx)
        return 4
    distributed.close(ctx)
    return 0


def _started() -> None:
    """Start-up is over: its garbage collected once, what it left frozen (full collections while
    serving leave it alone, as the scheduler's do) and the collector, off since the command
    began (worker/cli.py), on again."""
    gc.collect()
    gc.freeze()
    gc.enable()


def _ended(node: NodeDir) -> str | None:
    if fatal := node.fatal():
        return f"an earlier start failed for good ({fatal.message})"
    if node.stop_requested():
        return "node.sh was told to stop while the group restarted"
    return None


def _permanent(node: NodeDir | None, code: int, message: str) -> int:
    if node:
        node.record_fatal(code, message)
    return code


# What rank 0 tells every rank once it has tried to register, so that all leave together.
SERVE, STOPPED, UNREACHABLE, REFUSED = "serve", "stopped", "unreachable", "refused"


def _register(coordinator: Coordinator | None, node: NodeDir | None, devices: list[DeviceInfo]) -> str | None:
    """A stop that came while the group started (the signal reached no rank, or only rank 0, or it
    came during a restart and left only the stop file) ends the group before it registers."""
    if coordinator is None:
        return None  # followers hear rank 0's decision
    if coordinator.draining or (node and node.stop_requested()):
        return STOPPED
    try:
        coordinator.register(devices)
    except Interrupted:
        return STOPPED
    except Unavailable as e:
        log.critical("the scheduler at %s did not answer for %.0fs (%s); exiting for a restart",
                     coordinator.cfg.queue.url, REGISTER_DEADLINE_S, e)
        return UNREACHABLE
    except FatalQueueError as e:
        log.critical("scheduler refused this worker: %s", e)
        _permanent(node, EXIT_REFUSED, f"scheduler refused this worker: {e}")
        return REFUSED
    return SERVE


def _left_before_serving(start: str, node: NodeDir | None, ctx) -> int:
    distributed.close(ctx)
    if start == UNREACHABLE:
        return 1  # torchrun starts the group again, which tries again
    if start == REFUSED:
        return EXIT_REFUSED
    log.info("stopped before serving: a stop was requested while the group started")
    if node:
        node.record_drained()
    return 0


class StopSignals:
    """SIGTERM or SIGINT drains; another one later stops at once (leases expire, tasks are retried).

    One stop can arrive several times within milliseconds: SLURM signals every process of a step,
    and torchrun forwards what it gets. Repeats within `same_stop_s` are that one stop, not an
    operator insisting."""

    def __init__(self, coordinator: Coordinator | None, same_stop_s: float = 1.0,
                 clock=time.monotonic, exit=os._exit) -> None:
        self._coordinator = coordinator
        self._same_stop_s = same_stop_s
        self._clock = clock
        self._exit = exit
        self._first: float | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, _frame=None) -> None:
        if self._coordinator is None:
            return  # followers stop when the coordinator broadcasts Shutdown
        now = self._clock()
        if self._first is None:
            self._first = now
            self._coordinator.request_stop()
        elif now - self._first >= self._same_stop_s:
            self._exit(128 + signum)


def _describe(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        # The UUID lets rank 0 find this GPU in NVML (temperature, power, clocks) when on its host.
        return DeviceInfo(name=props.name, memory_bytes=props.total_memory, uuid=str(props.uuid))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceInfo(name=f"cpu ({platform.machine()})", memory_bytes=memory)
