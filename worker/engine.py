"""The model: loaded once per rank with `FluxPipeline.from_pretrained`, kept resident, run per job.

`source` is a Hub id or a local directory; HF_HUB_OFFLINE is honoured by huggingface_hub itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from worker.config import ModelConfig
from worker.validation import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Picture:
    pixels: np.ndarray  # HxWx3 uint8 RGB
    # Values that were NaN or inf before the cast to 8 bits, which hides them: a corrupted device
    # context or an overflowing dtype. The quality check refuses such an image.
    nonfinite: int = 0


class Engine:
    def __init__(self, pipe, cfg: ModelConfig, device: torch.device) -> None:
        self.pipe = pipe
        self.cfg = cfg
        self.device = device
        self.generations = 0  # images produced since start, warm-up included

    @classmethod
    def load(cls, cfg: ModelConfig, device: torch.device) -> "Engine":
        from diffusers import FluxPipeline  # heavy import, kept out of module import time
        from diffusers.utils import logging as dlog
        from transformers.utils import logging as tlog

        # Progress bars would flood the worker's logs, once per component and rank.
        dlog.disable_progress_bar()
        tlog.disable_progress_bar()
        t0 = time.perf_counter()
        pipe = FluxPipeline.from_pretrained(cfg.source, revision=cfg.revision, dtype=getattr(torch, cfg.dtype))
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        log.info("loaded %s from %s on %s in %.1fs", cfg.name, cfg.source, device, time.perf_counter() - t0)
        return cls(pipe, cfg, device)

    @torch.inference_mode()
    def generate(self, job: Job) -> Picture:
        """Same (prompt, seed, size, steps) -> same pixels."""
        if job.seed is None:
            raise ValueError("job has no seed; rank 0 draws one before the broadcast")
        # A CPU generator draws the same noise on every device and every rank count.
        generator = torch.Generator("cpu").manual_seed(job.seed)
        out = self.pipe(
            prompt=job.prompt,
            width=job.width,
            height=job.height,
            num_inference_steps=job.steps,
            guidance_scale=self.cfg.guidance_scale,
            max_sequence_length=self.cfg.max_sequence_length,
            generator=generator,
            output_type="np",
        ).images[0]
        self.generations += 1
        return to_picture(out)


def to_picture(out: np.ndarray) -> Picture:
    """Float HxWx3 in [0, 1] -> 8 bits, with the same rounding as diffusers' numpy_to_pil."""
    finite = np.isfinite(out)
    nonfinite = int(out.size - np.count_nonzero(finite))
    if nonfinite:
        out = np.where(finite, out, 0.0)  # the cast of NaN is undefined; make it defined, then flag it
    return Picture((np.clip(out, 0.0, 1.0) * 255).round().astype(np.uint8), nonfinite)
