"""A job: one validated generation request, what every rank needs to produce the same images."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class LoraRef(BaseModel):
    """One adapter a job uses: its file by content (sha256, set once rank 0 fetched it), where it
    came from, its scale, and the task's field that named it (for errors)."""

    model_config = ConfigDict(frozen=True)

    source: str  # the URL it is fetched from (a registered name resolved)
    scale: float
    sha256: str | None = None
    field: str = "input.loras"


class Job(BaseModel):
    """One validated generation: what every rank needs to produce the same images. A job of
    `num_images` images makes image i with seed `seed + i`, each as a job of one image would."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    prompt: str
    width: int
    height: int
    steps: int
    seed: int | None
    output_format: str
    model: str | None = None  # the model that makes it (the worker's registry); None: the one loaded at start
    num_images: int = 1
    loras: tuple[LoraRef, ...] = ()  # LoRA adapters, in the order given

    @property
    def adapter_set(self) -> tuple[tuple[str | None, float], ...]:
        """What a round's jobs must share: the pipeline holds one set of adapters at a time."""
        return tuple((ref.sha256 or ref.source, ref.scale) for ref in self.loras)

    @property
    def seeds(self) -> tuple[int, ...]:
        """Each image's seed, in image order (rank 0 draws the first before the broadcast)."""
        if self.seed is None:
            raise ValueError("job has no seed; rank 0 draws one before the broadcast")
        return tuple(self.seed + i for i in range(self.num_images))

    def images(self) -> list["Job"]:
        """One job of one image per image, in image order: what the engine generates."""
        if self.num_images == 1:
            return [self]
        return [self.model_copy(update={"seed": seed, "num_images": 1}) for seed in self.seeds]
