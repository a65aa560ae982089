"""Process-group setup and the few collectives the worker uses.

All of torch.distributed's configuration lives here: the device is set before the group exists, NCCL
gets async error handling, and there are two timeouts: a generous one for loading and warm-up (the
default group) and a tight one for serving (a second group used by the serve loop).

Any failure inside a collective raises CollectiveError. The entry point then exits non-zero without
touching the group again: peers stuck in a collective cannot be trusted, torchrun restarts the whole
group, and the queue's lease expiry hands the task to the next attempt.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from worker.config import ConfigError, DistributedConfig

log = logging.getLogger(__name__)


class CollectiveError(RuntimeError):
    """A collective failed or timed out; this process must exit."""


@dataclass
class DistContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    coordinator: int = 0  # the rank that talks to the world; the source and sink of every collective
    serve_group: Any = field(default=None, repr=False)
    # The same across torchrun's restarts of this group, distinct for every launch: the scheduler
    # requeues what an earlier registration with it held. None outside torchrun.
    node_id: str | None = None

    @property
    def is_coordinator(self) -> bool:
        return self.rank == self.coordinator


def init_distributed(cfg: DistributedConfig, device_pref: str, coordinator: int = 0,
                     dtype: str = "float32") -> DistContext:
    """Raises ConfigError, naming model.device, when the device cannot serve this model."""
    # torchrun sets these; a plain `python -m worker` is a group of one.
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_pref, local_rank, dtype)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl":
        if device.type != "cuda":
            raise ValueError("distributed.backend: nccl needs model.device cuda")
        # Abort the communicator and raise on a timeout instead of hanging in a dead collective.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init_process_group: NCCL binds to the current device
    timeout = timedelta(seconds=cfg.load_timeout_s)
    kwargs: dict[str, Any] = dict(backend=backend, timeout=timeout, rank=rank, world_size=world)
    if world == 1 and "MASTER_ADDR" not in os.environ:
        kwargs["store"] = dist.HashStore()
    else:
        kwargs["store"] = _attempt_store(rank, world, timeout)
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    log.info("rank %d/%d on %s (%s)", rank, world, device, backend)
    return DistContext(rank, world, device, backend, coordinator, node_id=_node_id())


def _node_id() -> str | None:
    """Host and torchrun run id: torchrun draws the run id once per launch (--standalone) or takes
    --rdzv-id, and keeps it across restarts of the group."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return f"{socket.gethostname()}/{run_id}" if run_id else None


def _attempt_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store, with a prefix per torchrun restart.

    torchrun (2.13, --standalone) keeps one agent store across restarts of the group. Without a
    prefix, a restarted group reads the dead group's gloo/NCCL addresses from it and fails or hangs
    while connecting, so a crashed rank would take the node down instead of being restarted.
    """
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=not agent_hosts_store and rank == 0, timeout=timeout, multi_tenant=True)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"dit-worker/attempt-{attempt}", base)


def enter_serving(ctx: DistContext, cfg: DistributedConfig) -> None:
    """Switches the serve loop to a group with the tight timeout, once loading and warm-up are done."""
    ctx.serve_group = dist.new_group(backend=ctx.backend, timeout=timedelta(seconds=cfg.serve_timeout_s))


def load_group() -> Any:
    """The default group, whose timeout is distributed.load_timeout_s: for loading and warming up,
    at start and in a swap, where a rank may work for minutes before the next collective."""
    return dist.group.WORLD


def pick_device(pref: str, local_rank: int, dtype: str = "float32") -> torch.device:
    """"auto" is CUDA when one is visible. Without one it falls back to the CPU only for float32
    models: a bfloat16/float16 model (production FLUX) on a CPU would serve at minutes per image, and
    a node that lost its driver must not take traffic that way unless the config names the CPU."""
    if torch.cuda.is_available() and pref != "cpu":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if pref == "cpu" or (pref == "auto" and dtype == "float32"):
        return torch.device("cpu")
    if pref == "cuda":
        raise ConfigError("model.device: cuda requested but no CUDA device is visible")
    raise ConfigError(f"model.device: 'auto' found no CUDA device, and a {dtype} model on the CPU would "
                      "serve at minutes per image; set model.device = \"cpu\" to run on the CPU anyway")


def broadcast(obj: Any, ctx: DistContext, group: Any = None) -> Any:
    """The coordinator's object reaches every rank. Small picklable objects only (commands, jobs)."""
    if ctx.world_size == 1:  # nothing to send: no pickling, and no copy through the GPU that waits for it
        return obj
    box = [obj if ctx.is_coordinator else None]
    try:
        dist.broadcast_object_list(box, src=ctx.coordinator, group=group or ctx.serve_group, device=_comm_device(ctx))
    except Exception as e:
        raise CollectiveError(f"broadcast failed: {e}") from e
    return box[0]


def all_gather(obj: Any, ctx: DistContext, group: Any = None) -> list[Any]:
    """Every rank's object, in rank order, on every rank. Also a barrier."""
    if ctx.world_size == 1:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    try:
        dist.all_gather_object(out, obj, group=group or ctx.serve_group)
    except Exception as e:
        raise CollectiveError(f"all_gather failed: {e}") from e
    return out


def gather(obj: Any, ctx: DistContext, group: Any = None) -> list[Any]:
    """Every rank's object on the coordinator, in rank order; the others get []. Images travel this way,
    over the collective backend: no rank but the coordinator does network I/O."""
    if ctx.world_size == 1:  # the image stays where it is: no pickled copy through the GPU and back
        return [obj]
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_coordinator else None
    try:
        dist.gather_object(obj, out, dst=ctx.coordinator, group=group or ctx.serve_group)
    except Exception as e:
        raise CollectiveError(f"gather failed: {e}") from e
    return out or []


def _comm_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def close(ctx: DistContext) -> None:
    """Clean exit only: after a CollectiveError the group is left alone (see module doc)."""
    if dist.is_initialized():
        dist.destroy_process_group()
