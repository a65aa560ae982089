"""Lockstep generation in a one-rank gloo group: outcome agreement and failure capture."""

import numpy as np

from worker.distributed import DistContext
from worker.engine import Picture
from worker.lockstep import generate
from worker.validation import Job

JOB = Job(task_id="t", prompt="p", width=64, height=64, steps=1, seed=3, output_format="png")


class FakeEngine:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail

    def generate(self, job: Job) -> Picture:
        if self.fail:
            raise self.fail
        return Picture(np.full((job.height, job.width, 3), job.seed, np.uint8))


def test_single_process_group(ctx: DistContext):
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.is_coordinator) == (0, 1, "gloo", True)


def test_success_returns_the_image(ctx):
    out = generate(FakeEngine(), JOB, ctx)
    assert out.errors == [] and out.image.shape == (64, 64, 3)


def test_a_failing_rank_is_reported_not_raised(ctx):
    out = generate(FakeEngine(RuntimeError("CUDA out of memory")), JOB, ctx)
    assert out.image is None and out.errors == ["rank 0: RuntimeError: CUDA out of memory"]
