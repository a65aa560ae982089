"""What every rank does in step: receive a command from the coordinator, generate, agree on the outcome.

The coordinator broadcasts exactly one command per serve-loop turn (Idle keeps followers' collective
waits short while the queue is empty). A Generate carries a round: one batch of jobs per slot;
worker.ranks.sharing says which batch each rank generates, and a job of several images is several
rows of it, made in passes of at most the round's `per_pass` (the batch sizes warmed up). After generating, a gather of each rank's batch to the coordinator is
the closing barrier: it learns every image and every failure, and no rank runs ahead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker.adapters import AdapterCache, Source
from worker.config import WorkerConfig
from worker.model.engine import Batch, Engine, Picture
from worker.model.adapters import Wanted
from worker.model.job import Job, LoraRef
from worker.ranks import sharing
from worker.model.resident import Resident
from worker.ranks.distributed import DistContext, all_gather, broadcast, gather, load_group

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Idle:
    pass


@dataclass(frozen=True)
class Generate:
    batches: tuple[tuple[Job, ...], ...]  # one per slot; each of one shape
    # Images a rank generates in one pass (batch.max_size, the sizes warmed up): a batch of more
    # images (a task's num_images) is made in several passes.
    per_pass: int = 1


@dataclass(frozen=True)
class Shutdown:
    reason: str


@dataclass(frozen=True)
class Swap:
    """Evict these models, then load and warm up `load`, on every rank (worker.model.resident)."""

    load: str
    evict: tuple[str, ...] = ()


Command = Idle | Generate | Shutdown | Swap


@dataclass
class Generated:
    """One job of a round, on the coordinator."""

    pictures: list[Picture]  # its images in image order (seed, seed + 1, ...); none if a rank failed
    errors: list[str]  # one entry per failed rank, empty when all succeeded
    # ms: embed, denoise, vae (its rank's batch, its passes together), gather, generate (the whole round)
    timings: dict[str, float] = field(default_factory=dict)
    batch_size: int = 1  # images its rank generated in one pass with its own
    rank: int = 0  # the rank that generated it


def generate(engine: Engine, batches: Sequence[Sequence[Job]], ctx: DistContext, mode: str = "data",
             group=None, per_pass: int = 1, adapter_files: Callable[[LoraRef], Path] | None = None) -> list[Generated]:
    """Every rank calls this with the same round. The coordinator gets one Generated per job, in round
    order (batch by batch); the other ranks get an empty list. A round's jobs share one set of LoRA
    adapters, each rank's file found by `adapter_files`."""
    t0 = time.perf_counter()
    part = _run(engine, sharing.mine(batches, ctx.rank, mode), per_pass, ctx, adapter_files)
    t1 = time.perf_counter()
    if mode == "context":
        # Every rank holds the same images; only failures need to travel.
        errors = [e for e in all_gather(_error(part), ctx, group) if e is not None]
        parts, makers, made_of = [part], [ctx.coordinator], [batches[0]]
    else:
        parts = gather(part, ctx, group)  # the coordinator: every rank's batch; others: []
        errors = [e for e in map(_error, parts) if e is not None]
        makers, made_of = list(range(len(batches))), batches
    if not ctx.is_coordinator:
        return []
    t2 = time.perf_counter()
    if errors:
        return [Generated([], errors) for batch in batches for _ in batch]
    round_ms = {"gather": (t2 - t1) * 1e3, "generate": (t2 - t0) * 1e3}
    out = []
    for rank, made, jobs in zip(makers, parts, made_of):
        pictures = iter(made.pictures)
        together = min(per_pass, len(made.pictures))
        for job in jobs:
            out.append(Generated([next(pictures) for _ in range(job.num_images)], [],
                                 {**made.timings, **round_ms}, together, rank))
    return out


def _run(engine: Engine, jobs: list[Job], per_pass: int, ctx: DistContext,
         adapter_files: Callable[[LoraRef], Path] | None = None) -> Batch | str:
    """This rank's batch, its images in passes of at most `per_pass`, or what went wrong on it."""
    if not jobs:
        return Batch([])
    images = [image for job in jobs for image in job.images()]
    try:
        _use_adapters(engine, jobs[0].loras, adapter_files)
        return merged([engine.generate_batch(images[i:i + per_pass]) for i in range(0, len(images), per_pass)])
    except Exception as e:  # any device or model error: report it, keep the ranks in step
        log.exception("generation failed for %s", ", ".join(j.task_id for j in jobs))
        return f"rank {ctx.rank}: {type(e).__name__}: {e}"


def _use_adapters(engine: Engine, loras: Sequence[LoraRef], files: Callable[[LoraRef], Path] | None) -> None:
    """The round's adapters on this rank's pipeline (none: LoRA off)."""
    adapters = getattr(engine, "adapters", None)
    if adapters is None or (not loras and not adapters.held()):
        return
    if loras and files is None:
        raise RuntimeError("this worker takes no adapters (no lora.allow or lora.registered)")
    adapters.use([Wanted(ref.sha256, files(ref), ref.scale, ref.field) for ref in loras])


def merged(passes: list[Batch]) -> Batch:
    """One batch's passes as one: their pictures in order, each stage's time summed."""
    if len(passes) == 1:
        return passes[0]
    timings: dict[str, float] = {}
    for made in passes:
        for stage, ms in made.timings.items():
            timings[stage] = timings.get(stage, 0.0) + ms
    return Batch([p for made in passes for p in made.pictures], timings)


def _error(part: Batch | str) -> str | None:
    return part if isinstance(part, str) else None


def follow(resident: Resident, ctx: DistContext, mode: str = "data") -> str:
    """A follower's whole serve loop. Returns the shutdown reason."""
    while True:
        cmd: Command = broadcast(None, ctx)
        if isinstance(cmd, Shutdown):
            return cmd.reason
        if isinstance(cmd, Swap):
            swap(resident, cmd, ctx)
        elif isinstance(cmd, Generate):
            generate(resident.engine(model_of(cmd.batches, resident)), cmd.batches, ctx, mode, per_pass=cmd.per_pass,
                     adapter_files=resident.adapter_files)


def model_of(batches: Sequence[Sequence[Job]], resident: Resident) -> str:
    """A round's model (its jobs share one); a job naming none is the model loaded at start."""
    return batches[0][0].model or resident.names()[0]


def swap(resident: Resident, cmd: Swap, ctx: DistContext) -> list[str]:
    """Every rank evicts, loads and warms up, then all agree: [] when every rank holds `cmd.load`
    now, else what went wrong on each rank that failed (and no rank keeps it). The agreement is on
    the default group, whose timeout covers a load."""
    for name in cmd.evict:
        resident.evict(name)
    error = None
    try:
        resident.load(cmd.load)
    except Exception as e:  # a bad checkpoint, out of memory: that model fails, the worker goes on
        log.exception("loading %s failed", cmd.load)
        error = f"rank {ctx.rank}: {type(e).__name__}: {e}"
    errors = [e for e in all_gather(error, ctx, load_group()) if e is not None]
    if errors:
        resident.evict(cmd.load)
    return errors


def start_models(cfg: WorkerConfig, ctx: DistContext) -> Resident:
    """Every rank's models: [model] loaded and warmed up now, the others ([models.<id>]) on a Swap."""
    def load(name: str) -> Engine:
        return Engine.load(cfg.catalog[name], ctx.device, cfg.speed_of(name), cfg.parallel, ctx.world_size, cfg.lora)

    def warm(engine: Engine) -> None:
        name = engine.cfg.name
        warmup = cfg.warmup_of(name)
        warm_up(engine, warmup.sizes, range(1, cfg.batch.max_size + 1), warmup.prompt,
                cfg.limits_of(name).default_steps, ctx, cfg.parallel.mode, name)

    resident = Resident(load, warm, _adapter_files(cfg))
    resident.load(cfg.model.name)
    return resident


def _adapter_files(cfg: WorkerConfig) -> Callable[[LoraRef], Path] | None:
    """Each rank finds a round's adapter files in its node's cache (rank 0 fetched them at
    admission; a rank on another node, or after an eviction, fetches them itself)."""
    if not cfg.lora.accepted:
        return None
    cache = AdapterCache(cfg.lora)
    cache.open()
    return lambda ref: cache.get(Source(ref.source, ref.field), ref.sha256).path


def warm_up(engine: Engine, sizes: tuple[tuple[int, int], ...], batch_sizes: range, prompt: str, steps: int,
            ctx: DistContext, mode: str = "data", model: str | None = None) -> None:
    """Runs every configured size at every batch size on every rank before the worker reports ready,
    so compiled graphs exist for each shape a request can bring."""
    for width, height in sizes:
        for n in batch_sizes:
            # Each rank generates a batch of n images: its own in data mode, the same one in context mode.
            batches = [[Job(task_id=f"warmup-{s}-{i}", prompt=prompt, width=width, height=height, steps=steps,
                            seed=i, output_format="png", model=model) for i in range(n)]
                       for s in range(sharing.slots(ctx.world_size, mode))]
            t0 = time.perf_counter()
            outs = generate(engine, batches, ctx, mode, group=load_group(), per_pass=n)  # the generous load timeout
            if outs and outs[0].errors:
                raise RuntimeError(f"warm-up at {width}x{height}, batch {n} failed: {'; '.join(outs[0].errors)}")
            log.info("warm-up %dx%d batch %d: %.2fs", width, height, n, time.perf_counter() - t0)
    if engine.compile_cache is not None:
        log.info("compile cache: %(hits)d graph(s) loaded, %(misses)d compiled", engine.compile_cache.stats())
