"""What every rank does in step: receive a command from rank 0, generate, agree on the outcome.

Rank 0 broadcasts exactly one command per serve-loop turn (Idle keeps followers' collective waits
short while the queue is empty). After a generation, an all_gather of each rank's error acts as the
closing barrier and tells every rank whether any peer failed, so no rank runs ahead or diverges.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from worker.distributed import DistContext, all_gather, broadcast
from worker.engine import Engine
from worker.validation import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Idle:
    pass


@dataclass(frozen=True)
class Generate:
    job: Job


@dataclass(frozen=True)
class Shutdown:
    reason: str


Command = Idle | Generate | Shutdown


@dataclass
class Outcome:
    image: np.ndarray | None  # this rank's image; None if this rank failed
    errors: list[str]  # one entry per failed rank, empty when all succeeded
    seconds: float
    nonfinite: int = 0  # see engine.Picture


def generate(engine: Engine, job: Job, ctx: DistContext, group=None) -> Outcome:
    t0 = time.perf_counter()
    picture, error = None, None
    try:
        picture = engine.generate(job)
    except Exception as e:  # any device or model error: report it, keep the ranks in step
        log.exception("generation failed for task %s", job.task_id)
        error = f"rank {ctx.rank}: {type(e).__name__}: {e}"
    errors = [e for e in all_gather(error, ctx, group) if e is not None]
    if errors:
        return Outcome(None, errors, time.perf_counter() - t0)
    return Outcome(picture.pixels, errors, time.perf_counter() - t0, picture.nonfinite)


def follow(engine: Engine, ctx: DistContext) -> str:
    """A follower's whole serve loop. Returns the shutdown reason."""
    while True:
        cmd: Command = broadcast(None, ctx)
        if isinstance(cmd, Shutdown):
            return cmd.reason
        if isinstance(cmd, Generate):
            generate(engine, cmd.job, ctx)


def warm_up(engine: Engine, sizes: tuple[tuple[int, int], ...], prompt: str, steps: int,
            ctx: DistContext) -> None:
    """Runs each configured size once on every rank before the worker reports ready."""
    for width, height in sizes:
        job = Job(task_id="warmup", prompt=prompt, width=width, height=height, steps=steps, seed=0,
                  output_format="png")
        out = generate(engine, job, ctx, group=None)  # default group: the generous load timeout
        if out.errors:
            raise RuntimeError(f"warm-up at {width}x{height} failed: {'; '.join(out.errors)}")
        log.info("warm-up %dx%d: %.2fs", width, height, out.seconds)
