"""Context parallelism ([parallel] mode = "context"): every rank works on the same images, each
holding a slice of the joint text + image sequence (diffusers' ContextParallelConfig, Ulysses or
Ring). Data parallelism needs nothing from the model; worker.ranks.sharing splits its rounds.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from worker.config import ParallelConfig

log = logging.getLogger(__name__)


def context_parallel(cfg: ParallelConfig, world: int) -> bool:
    """Whether each image is split across the ranks (context mode with more than one rank)."""
    return cfg.mode == "context" and world > 1


def sequence_fits(width: int, height: int, text_tokens: int, degree: int) -> str | None:
    """Ulysses and Ring split the joint (text + image) sequence evenly across ranks: a size whose
    token count does not divide would fail inside the collective, so it is refused up front."""
    tokens = text_tokens + (width // 16) * (height // 16)
    if tokens % degree:
        return (f"width x height = {width}x{height} gives {tokens} tokens with the text, not divisible by "
                f"the {degree} context-parallel ranks")
    return None


def enable_context_parallel(transformer, cfg: ParallelConfig, world: int, device: torch.device) -> None:
    from diffusers import ContextParallelConfig

    degree = {"ring_degree": world} if cfg.context_kind == "ring" else {"ulysses_degree": world}
    with _accelerator_shim(device):
        transformer.enable_parallelism(config=ContextParallelConfig(**degree))
    log.info("context parallel: %s over %d ranks", cfg.context_kind, world)


@contextlib.contextmanager
def _accelerator_shim(device: torch.device):
    """diffusers (0.42) places each rank on `rank % torch.accelerator.device_count()`, which divides
    by zero on a machine with no accelerator. For a CPU group, count the CPU as the one device while
    the parallel config is resolved; diffusers then builds its mesh on the CPU over gloo. Nothing
    else reads the count inside this block, and on an accelerator nothing is changed."""
    if device.type != "cpu" or torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = original
