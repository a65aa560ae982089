"""What every rank does in step: receive a command from rank 0, generate, agree on the outcome.

Rank 0 broadcasts exactly one command per serve-loop turn (Idle keeps followers' collective waits
short while the queue is empty). A Generate carries a round of jobs; worker.parallel says which
part each rank generates. After generating, a gather of each rank's results to rank 0 is the
closing barrier: rank 0 learns every image and every failure, and no rank runs ahead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from worker import parallel
from worker.distributed import DistContext, all_gather, broadcast, gather
from worker.engine import Engine
from worker.validation import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Idle:
    pass


@dataclass(frozen=True)
class Generate:
    jobs: tuple[Job, ...]


@dataclass(frozen=True)
class Shutdown:
    reason: str


Command = Idle | Generate | Shutdown


@dataclass
class Outcome:
    image: np.ndarray | None  # None if the rank that generated it failed
    errors: list[str]  # one entry per failed rank, empty when all succeeded
    seconds: float
    nonfinite: int = 0  # see engine.Picture
    timings: dict[str, float] = field(default_factory=dict)  # ms: embed, denoise, vae, gather
    batch_size: int = 1
    rank: int = 0  # the rank that generated it


@dataclass
class _Part:
    """One rank's share of a round, as sent to rank 0."""

    images: list[tuple[np.ndarray, int]]  # (pixels, nonfinite) per job of the share
    error: str | None
    timings: dict[str, float]


def generate(engine: Engine, jobs: list[Job], ctx: DistContext, mode: str = "data", group=None) -> list[Outcome]:
    """Every rank calls this with the same round. Rank 0 gets one Outcome per job, in round order;
    the other ranks get an empty list."""
    t0 = time.perf_counter()
    mine = parallel.share(jobs, ctx.rank, ctx.world_size, mode)
    part = _run(engine, mine, ctx)
    t1 = time.perf_counter()
    if mode == "context":
        # Every rank holds the same images; only failures need to travel.
        errors = [e for e in all_gather(part.error, ctx, group) if e is not None]
        parts = [part] if ctx.rank == 0 else []
    else:
        parts = gather(part, ctx, group)  # rank 0: every rank's share; others: []
        errors = [p.error for p in parts if p.error is not None]
    if ctx.rank != 0:
        return []
    gathered = (time.perf_counter() - t1) * 1e3
    return _outcomes(jobs, parts, errors, mode, ctx.world_size, time.perf_counter() - t0, gathered)


def _run(engine: Engine, jobs: list[Job], ctx: DistContext) -> _Part:
    if not jobs:
        return _Part([], None, {})
    try:
        batch = engine.generate_batch(jobs)
    except Exception as e:  # any device or model error: report it, keep the ranks in step
        log.exception("generation failed for %s", ", ".join(j.task_id for j in jobs))
        return _Part([], f"rank {ctx.rank}: {type(e).__name__}: {e}", {})
    return _Part([(p.pixels, p.nonfinite) for p in batch.pictures], None, batch.timings)


def _outcomes(jobs: list[Job], parts: list[_Part], errors: list[str], mode: str, world: int,
              seconds: float, gathered_ms: float) -> list[Outcome]:
    if errors:
        return [Outcome(None, errors, seconds) for _ in jobs]
    out: list[Outcome | None] = [None] * len(jobs)
    for rank, part in enumerate(parts):
        # The inverse of parallel.share: rank r made jobs r, r + world, ... of the round.
        slots = range(len(jobs)) if mode == "context" or world == 1 else range(rank, len(jobs), world)
        for slot, (pixels, nonfinite) in zip(slots, part.images):
            out[slot] = Outcome(pixels, [], seconds, nonfinite, {**part.timings, "gather": gathered_ms},
                                len(part.images), rank if mode == "data" else 0)
    return out


def follow(engine: Engine, ctx: DistContext, mode: str = "data") -> str:
    """A follower's whole serve loop. Returns the shutdown reason."""
    while True:
        cmd: Command = broadcast(None, ctx)
        if isinstance(cmd, Shutdown):
            return cmd.reason
        if isinstance(cmd, Generate):
            generate(engine, list(cmd.jobs), ctx, mode)


def warm_up(engine: Engine, sizes: tuple[tuple[int, int], ...], batch_sizes: range, prompt: str, steps: int,
            ctx: DistContext, mode: str = "data") -> None:
    """Runs every configured size at every batch size on every rank before the worker reports ready,
    so compiled graphs exist for each shape a request can bring."""
    for width, height in sizes:
        for n in batch_sizes:
            # Each rank generates n images: a full share in data mode, the whole round in context mode.
            per_round = n * (ctx.world_size if mode == "data" else 1)
            jobs = [Job(task_id=f"warmup-{i}", prompt=prompt, width=width, height=height, steps=steps, seed=i,
                        output_format="png") for i in range(per_round)]
            t0 = time.perf_counter()
            outs = generate(engine, jobs, ctx, mode, group=None)  # default group: the generous load timeout
            if outs and outs[0].errors:
                raise RuntimeError(f"warm-up at {width}x{height}, batch {n} failed: {'; '.join(outs[0].errors)}")
            log.info("warm-up %dx%d batch %d: %.2fs", width, height, n, time.perf_counter() - t0)
