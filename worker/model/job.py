"""A job: one validated generation request, what every rank needs to produce the same image."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Job(BaseModel):
    """One validated generation: what every rank needs to produce the same image."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    prompt: str
    width: int
    height: int
    steps: int
    seed: int | None
    output_format: str
    model: str | None = None  # the model that makes it (the worker's registry); None: the one loaded at start
