"""The model: loaded once per rank, kept resident, run per batch of compatible jobs.

`model.source` is a Hub id or a local directory for `DiffusionPipeline.from_pretrained`, which picks
the pipeline class from its model_index.json (FluxPipeline, PixArtSigmaPipeline, ...); HF_HUB_OFFLINE
is honoured by huggingface_hub itself. `model.random_arch` builds an architecture with random weights
instead (benchmarks where no weights can be downloaded, and the tests' second family).

A FluxPipeline gets the prompts' embeddings from the engine (each prompt on its own, optionally from
the LRU cache); any other pipeline is called with the prompts and embeds them itself. Either way a
job's image depends only on its own (prompt, seed, size, steps): each job has its own generator, and
each prompt is embedded on its own row, so batching changes only the kernels' rounding, never the
noise or the conditioning.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from worker.config import LoraConfig, ModelConfig, ParallelConfig, SpeedConfig
from worker.model import parallel, speed
from worker.model.adapters import Adapters, Slots, holder_for
from worker.model.compile_cache import CompileCache, compile_errors
from worker.model.generic_path import GenericPath
from worker.model.job import Job
from worker.model.prompt_cache import PromptCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Picture:
    pixels: np.ndarray  # HxWx3 uint8 RGB
    # Values that were NaN or inf before the cast to 8 bits, which hides them: a corrupted device
    # context or an overflowing dtype. The quality check refuses such an image.
    nonfinite: int = 0


@dataclass
class Batch:
    pictures: list[Picture]
    # Wall time of the whole batch per stage, ms: embed (the text encoders), denoise, vae (decode + to
    # 8 bits). For a pipeline that embeds its prompts itself, embed ends when its encode_prompt returns.
    timings: dict[str, float] = field(default_factory=dict)


class Engine:
    def __init__(self, pipe, cfg: ModelConfig, device: torch.device, prompt_cache_size: int = 0,
                 compile_cache: CompileCache | None = None, adapters: Adapters | Slots | None = None) -> None:
        self.pipe = pipe
        self.cfg = cfg
        self.device = device
        self.generations = 0  # images produced since start, warm-up included
        self.compile_cache = compile_cache
        self._compiled_cold = False  # the compile cache was set aside once already
        # FLUX: the engine embeds the prompts (LRU cache); any other family: the pipeline does.
        self.flux = is_flux(pipe)
        self.prompts = PromptCache(pipe, cfg.max_sequence_length, prompt_cache_size) if self.flux else None
        self.generic = GenericPath(pipe, cfg) if pipe is not None and not self.flux else None
        self.adapters = adapters or (Adapters(pipe) if pipe is not None else None)  # LoRA per round (input.loras)
        # One thread draws each batch's noise beside the text encoders (FLUX).
        self._noise = ThreadPoolExecutor(max_workers=1, thread_name_prefix="noise")

    @classmethod
    def load(cls, cfg: ModelConfig, device: torch.device, speed_cfg: SpeedConfig = SpeedConfig(),
             parallel_cfg: ParallelConfig = ParallelConfig(), world_size: int = 1,
             lora: LoraConfig | None = None) -> "Engine":
        from diffusers.utils import logging as dlog
        from transformers.utils import logging as tlog

        # Progress bars would flood the worker's logs, once per component and rank.
        dlog.disable_progress_bar()
        tlog.disable_progress_bar()
        t0 = time.perf_counter()
        compile_cache = None
        if speed_cfg.compile_cache_dir and (speed_cfg.compile or speed_cfg.compile_vae or speed_cfg.compile_text):
            compile_cache = CompileCache.open(speed_cfg.compile_cache_dir, device)  # before anything compiles
        pipe = load_pipeline(cfg, device)
        speed.place(pipe, speed_cfg, device)
        applied = speed.before_parallel(pipe, speed_cfg)
        context = parallel.context_parallel(parallel_cfg, world_size)
        if context:
            if getattr(pipe.transformer, "_cp_plan", None) is None:
                raise ValueError(f"parallel.mode: 'context' needs a transformer with a context-parallel plan; "
                                 f"{type(pipe.transformer).__name__} has none (use mode = 'data')")
            parallel.enable_context_parallel(pipe.transformer, parallel_cfg, world_size, device)
        adapters = holder_for(pipe, lora, compiled=speed_cfg.compile)  # slots: prepared before the compile
        applied += speed.after_parallel(pipe, speed_cfg, fullgraph=not context)
        pipe.set_progress_bar_config(disable=True)
        if speed_cfg.prompt_cache_size and not is_flux(pipe):
            log.info("speed.prompt_cache_size skipped: %s embeds its prompts itself", type(pipe).__name__)
        log.info("loaded %s from %s on %s in %.1fs; speed-ups: %s", cfg.name, _origin(cfg), device,
                 time.perf_counter() - t0, ", ".join(applied) or "none")
        return cls(pipe, cfg, device, speed_cfg.prompt_cache_size, compile_cache, adapters)

    def generate(self, job: Job) -> Picture:
        """Same (prompt, seed, size, steps) -> same pixels."""
        return self.generate_batch([job]).pictures[0]

    @torch.inference_mode()
    def generate_batch(self, jobs: list[Job], on_step: Callable[[int], None] | None = None) -> Batch:
        """Jobs of one size and step count, each with its own seed, in one pass. `on_step(i)` runs
        after denoising step i (a profiler's schedule steps with it)."""
        first = jobs[0]
        if any((j.width, j.height, j.steps) != (first.width, first.height, first.steps) for j in jobs):
            raise ValueError("a batch mixes sizes or step counts")
        if any(j.seed is None for j in jobs):
            raise ValueError("job has no seed; rank 0 draws one before the broadcast")
        if not self.flux:
            return self._generate_other(jobs, on_step)
        clock = StageClock(self.device)
        # The noise is drawn on the host while the host queues the text encoders: drawn after them,
        # it left the GPU idle for 6-9 ms an image on an H100.
        noise = self._noise.submit(draw_noise, self.pipe, jobs, self.device)
        # A prompt is embedded once a batch, however many of its images (num_images) the batch holds.
        embedded = {prompt: self.prompts.embed(prompt) for prompt in dict.fromkeys(j.prompt for j in jobs)}
        embeds, pooled = zip(*(embedded[j.prompt] for j in jobs))
        clock.mark("embedded")
        latents = noise.result()

        def on_step_end(_pipe, i, _t, _kwargs):
            if i == first.steps - 1:  # after the last scheduler step: denoising is done
                clock.mark("denoised")
            if on_step is not None:
                on_step(i)
            return {}

        images = self._compiling(lambda: self.pipe(
            prompt_embeds=torch.cat(embeds), pooled_prompt_embeds=torch.cat(pooled),
            width=first.width, height=first.height, num_inference_steps=first.steps,
            guidance_scale=self.cfg.guidance_scale, max_sequence_length=self.cfg.max_sequence_length,
            latents=latents, output_type="pt", callback_on_step_end=on_step_end,
        ).images)
        pictures = to_pictures(images)
        clock.mark("end")
        self.generations += len(jobs)
        return Batch(pictures, {"embed": clock.ms("start", "embedded"), "denoise": clock.ms("embedded", "denoised"),
                                "vae": clock.ms("denoised", "end")})

    def _generate_other(self, jobs: list[Job], on_step: Callable[[int], None] | None) -> Batch:
        images, marks = self.generic.run(jobs, on_step, self._compiling, self._sync)
        pictures = to_pictures(images)
        t2 = time.perf_counter()
        self.generations += len(jobs)
        embedded = marks.get("embedded", marks["start"])
        denoised = marks.get("denoised", t2)
        return Batch(pictures, {"embed": (embedded - marks["start"]) * 1e3,
                                "denoise": (denoised - embedded) * 1e3, "vae": (t2 - denoised) * 1e3})

    def _compiling(self, run):
        """`run()`; if a compile fails while the compile cache is in use, the cache may be damaged
        (a cold compile is not): it is set aside and `run` tried again, compiling cold. Once per
        process, so a compile that fails for another reason still fails."""
        try:
            return run()
        except compile_errors() as e:
            if self.compile_cache is None or self._compiled_cold:
                raise
            self._compiled_cold = True
            self.compile_cache.set_aside(e)
            return run()

    def _sync(self) -> None:
        """Waits for this engine's own stream only: rank 0's checks run on streams of their own."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


@torch.inference_mode()  # inference mode is per thread: an ordinary tensor recompiles the transformer
def draw_noise(pipe, jobs: list[Job], device: torch.device) -> torch.Tensor:
    """A FLUX batch's packed initial latents, as the pipeline would draw them: a CPU generator per
    job draws the same noise on every device, rank count and batch. In the pipeline's dtype (its
    prompt embeddings'), placed on `device`. An inference tensor, as every later step's latents are:
    drawn on the noise thread without it, the first step's input differed from the others' in
    autograd's dispatch keys, and dynamo compiled the transformer twice (a second cold compile of
    minutes on a GPU, and two sets of guards checked before each step)."""
    first = jobs[0]
    dtype = pipe.text_encoder.dtype if pipe.text_encoder is not None else pipe.transformer.dtype
    latents, _ = pipe.prepare_latents(len(jobs), pipe.transformer.config.in_channels // 4, first.height,
                                      first.width, dtype, torch.device("cpu"),
                                      [torch.Generator("cpu").manual_seed(j.seed) for j in jobs])
    if device.type == "cuda":
        return latents.pin_memory().to(device, non_blocking=True)
    return latents


class StageClock:
    """The stage boundaries of one batch, from its start. On CUDA each mark is an event recorded on
    the engine's stream: a mark never stops the host from queueing the next stage's kernels (a
    synchronize would leave the GPU idle while the host catches up) and never waits for another
    stream (rank 0's checks). The figures are read once the pixels are on the host, which waits for
    the stream; they are GPU time between marks. On a CPU, wall time."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._marks: dict[str, object] = {}
        self.mark("start")

    def mark(self, name: str) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks[name] = event
        else:
            self._marks[name] = time.perf_counter()

    def ms(self, since: str, until: str) -> float:
        """Milliseconds between two marks; a mark never made (a pipeline that skipped the step
        callback) reads as the last one made."""
        last = next(reversed(self._marks))
        a, b = self._marks.get(since, self._marks[last]), self._marks.get(until, self._marks[last])
        if self._cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def load_pipeline(cfg: ModelConfig, device: torch.device):
    """The pipeline as from_pretrained gives it, of the class its model_index.json names (or random
    weights of `random_arch`), not yet placed on `device` unless built there."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.random_arch != "none":
        from worker.model.architectures import build_pipeline

        return build_pipeline(cfg.random_arch, dtype=dtype, device=device)
    from diffusers import DiffusionPipeline  # heavy import, kept out of module import time

    return DiffusionPipeline.from_pretrained(cfg.source, revision=cfg.revision, dtype=dtype)


def is_flux(pipe) -> bool:
    if pipe is None:
        return False
    from diffusers import FluxPipeline

    return isinstance(pipe, FluxPipeline)


def _origin(cfg: ModelConfig) -> str:
    return f"random weights ({cfg.random_arch} architecture)" if cfg.random_arch != "none" else cfg.source


def peak_memory_mb(device: torch.device) -> int:
    """Peak device memory on CUDA; on a CPU, the process's peak resident set since it started."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) >> 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10


def to_pictures(images: torch.Tensor) -> list[Picture]:
    """Bx3xHxW floats in [0, 1] on the device -> 8-bit RGB on the host, with the same rounding as
    diffusers' numpy_to_pil. Only the 8-bit pixels cross to the host."""
    images = images.float()
    finite = torch.isfinite(images)
    nonfinite = (~finite).flatten(1).sum(1).tolist()
    # The cast of NaN is undefined; make it defined, then flag it.
    pixels = torch.where(finite, images, 0.0).clamp(0.0, 1.0).mul(255).round().to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()
    return [Picture(np.ascontiguousarray(p), n) for p, n in zip(pixels, nonfinite)]
