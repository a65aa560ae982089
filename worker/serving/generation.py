"""One round on every rank of the group, as rank 0 drives it: the round's tasks enter the generate
stage, the round is broadcast, every rank generates its batch in lockstep, the images come back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from worker.model.engine import Engine, peak_memory_mb
from worker.model.job import LoraRef
from worker.ranks import lockstep
from worker.ranks.distributed import DistContext, broadcast
from worker.serving import rounds
from worker.serving.ledger import Counter, Ledger, Stage
from worker.serving.metrics import Metrics
from worker.serving.profiling import Profiler
from worker.serving.task import Task


def generate_round(engine: Engine, batches: list[list[Task]], ctx: DistContext, mode: str, per_pass: int,
                   ledger: Ledger, metrics: Metrics, profiler: Profiler | None = None,
                   adapter_files: Callable[[LoraRef], Path] | None = None) -> list[lockstep.Generated]:
    """Each task's outcome, in the order of the batches; a rank makes its batch's images in passes
    of at most `per_pass`. A profiler armed over the ops endpoint starts before the round and
    counts it once it ends."""
    if profiler is not None:
        profiler.before_round()
    try:
        return _generate(engine, batches, ctx, mode, per_pass, ledger, metrics, adapter_files)
    finally:
        if profiler is not None:
            profiler.after_round()


def _generate(engine: Engine, batches: list[list[Task]], ctx: DistContext, mode: str, per_pass: int,
              ledger: Ledger, metrics: Metrics, adapter_files: Callable[[LoraRef], Path] | None
              ) -> list[lockstep.Generated]:
    jobs = tuple(tuple(t.job for t in batch) for batch in batches)
    round_ = [task for batch in batches for task in batch]
    metrics.round_generated(rounds.images(batch) for batch in batches)
    for task in round_:
        ledger.advance(task, Stage.GENERATE)
    t0 = time.perf_counter()
    broadcast(lockstep.Generate(jobs, per_pass), ctx)
    sent_ms = (time.perf_counter() - t0) * 1e3
    for task in round_:
        task.timings.record(broadcast=sent_ms)
    outs = lockstep.generate(engine, jobs, ctx, mode, per_pass=per_pass, adapter_files=adapter_files)
    # Every rank's images for tasks: rank 0's engine counts only its own, warm-up included.
    ledger.counters.add(Counter.IMAGES_GENERATED, sum(len(out.pictures) for out in outs))
    ledger.counters.set(Counter.PEAK_MEMORY_MB, peak_memory_mb(ctx.device))
    return outs
