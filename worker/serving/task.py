"""A task as rank 0 holds it from lease to report: its lease, its validated job, its stage timings.

One Task object follows the task through every stage (intake, generation, post stage, report), so
its timings are one record, filled stage by stage. A task is in one stage at a time, so one thread
writes its record at a time. Which stage that is, and the task's fate, are the ledger's to say
(worker.serving.ledger): the Task object is the identity of one attempt.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from protocol import Lease
from worker.model.job import Job


class Timings:
    """Wall time in ms of each stage a task went through (the result's `timings_ms`). Stages shared
    by a batch (broadcast, embed, denoise, vae, gather, generate) hold the batch's time."""

    def __init__(self) -> None:
        self._ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._ms[name] = (time.perf_counter() - t0) * 1e3

    def record(self, **ms: float) -> None:
        self._ms.update(ms)

    def as_dict(self) -> dict[str, float]:
        return dict(self._ms)


@dataclass(eq=False)
class Task:
    lease: Lease
    job: Job | None = None  # set once admitted (validated, seeded, checked)
    timings: Timings = field(default_factory=Timings)
    ready_at: float = 0.0  # time.monotonic() when admitted: the batching window starts here
    leased_at: float = field(default_factory=time.monotonic)

    def fields(self, **more) -> dict:
        """The structured log fields of an event about this task (telemetry.logs), for `extra=`."""
        return {"task_id": self.id, "attempt": self.lease.attempt, **more}

    def age_ms(self) -> float:
        return round((time.monotonic() - self.leased_at) * 1e3, 1)

    @property
    def id(self) -> str:
        return self.lease.task_id

    @property
    def model(self) -> str | None:
        """Its model, once admitted: a round's tasks share one."""
        return self.job.model if self.job else self.lease.model

    @property
    def shape(self) -> tuple[int, int, int]:
        """Tasks of one shape (width, height, steps) can share a batch."""
        return (self.job.width, self.job.height, self.job.steps)

    @property
    def adapter_set(self) -> tuple:
        """Its LoRA adapters and scales, once admitted: a round's tasks share one set."""
        return self.job.adapter_set if self.job else ()

    @property
    def images(self) -> int:
        """How many images it asks for (input.num_images)."""
        return self.job.num_images
