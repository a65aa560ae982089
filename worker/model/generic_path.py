"""The generic path: a pipeline of another family than FLUX (PixArt-Sigma, ...), called with the
prompts themselves, with the options its __call__ accepts, its stages timed from the outside."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import torch

from worker.config import ModelConfig
from worker.model.job import Job


class GenericPath:
    def __init__(self, pipe, cfg: ModelConfig) -> None:
        self.pipe = pipe
        self.cfg = cfg
        self.options, self.callback = call_options(pipe, cfg)

    def run(self, jobs: list[Job], on_step: Callable[[int], None] | None, compiling: Callable,
            sync: Callable[[], None]) -> tuple[torch.Tensor, dict[str, float]]:
        """The jobs' images (Bx3xHxW in [0, 1]) and the stages' marks (perf_counter): start,
        embedded, denoised. `compiling(run)` calls the pipeline (the engine's compile-cache
        recovery); `sync()` waits for the device."""
        first = jobs[0]
        marks: dict[str, float] = {}

        def step_done(i: int) -> None:
            if i == first.steps - 1:  # after the last scheduler step: denoising is done
                sync()
                marks["denoised"] = time.perf_counter()
            if on_step is not None:
                on_step(i)

        callback = {}
        if self.callback == "callback_on_step_end":
            callback["callback_on_step_end"] = lambda _pipe, i, _t, _kwargs: step_done(i) or {}
        elif self.callback == "callback":  # the older interface, PixArt's: after every step
            callback.update(callback=lambda i, _t, _latents: step_done(i), callback_steps=1)

        # The end of the text encoding, from the pipeline's own encode_prompt (plain Python, never
        # compiled: the compiled modules are the encoders it calls), wrapped for this call only.
        encode = self.pipe.encode_prompt

        def timed_encode(*args, **kwargs):
            out = encode(*args, **kwargs)
            sync()
            marks.setdefault("embedded", time.perf_counter())
            return out

        own = vars(self.pipe).get("encode_prompt")  # one set on the instance (a test's), if any
        marks["start"] = time.perf_counter()
        self.pipe.encode_prompt = timed_encode
        try:
            images = compiling(lambda: self.pipe(
                prompt=[j.prompt for j in jobs], width=first.width, height=first.height,
                num_inference_steps=first.steps, guidance_scale=self.cfg.guidance_scale,
                # A CPU generator per job draws the same noise on every device, rank count and batch.
                generator=[torch.Generator("cpu").manual_seed(j.seed) for j in jobs],
                output_type="pt", **self.options, **callback,
            ).images)
        finally:
            if own is None:
                del self.pipe.encode_prompt  # the class's own again
            else:
                self.pipe.encode_prompt = own
        return images, marks


def call_options(pipe, cfg: ModelConfig) -> tuple[dict, str | None]:
    """What the generic path passes to a pipeline of another family, of what its __call__ accepts,
    and the step callback it takes: callback_on_step_end, the older callback, or none (then the
    whole call after the text encoding counts as denoise)."""
    accepted = inspect.signature(type(pipe).__call__).parameters
    wanted = dict(
        max_sequence_length=cfg.max_sequence_length,
        # PixArt's binning denoises at the nearest trained aspect ratio and resizes the image: the
        # worker validates sizes itself, and its warm-up and batches are keyed on the size asked for.
        use_resolution_binning=False,
        # Caption cleaning needs bs4 and ftfy, which the worker does not install; without them PixArt
        # falls back to this (lower-case, strip) with two warnings per call.
        clean_caption=False,
    )
    callback = next((name for name in ("callback_on_step_end", "callback") if name in accepted), None)
    return {k: v for k, v in wanted.items() if k in accepted}, callback
