"""The per-device speed-ups of [speed], applied to a loaded pipeline in the one order that works:

    fused QKV -> channels_last VAE -> attention backend -> fp8 -> (context parallel) -> compile

(The compile cache, `speed.compile_cache_dir`, is opened by the engine before any of this compiles.)

Fusing comes before fp8 so the fused projection is what gets quantized; the attention backend comes
before context parallelism, which checks that the backend supports it; compile comes last so it
traces the final modules. `check` refuses, at start and naming the field, what this device cannot do.

The switches were written for FLUX; on a pipeline of another family (PixArt-Sigma) a switch its
modules do not support is skipped with a log line instead of failing: an attention backend where
the attention processors call SDPA directly, regional compile where the transformer names no
repeated blocks (the whole transformer is compiled instead).
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from worker.config import ParallelConfig, SpeedConfig

log = logging.getLogger(__name__)

# Attention backends whose kernels return the log-sum-exp that Ring attention merges partial
# results with; diffusers' native SDPA backend does not.
RING_BACKENDS = ("flash", "flash_hub", "_flash_3_hub", "_native_cudnn", "_native_flash", "sage", "sage_hub")


class SpeedConfigError(ValueError):
    """A [speed] or [parallel] setting this device or install cannot honour; names the field."""


def check(cfg: SpeedConfig, parallel: ParallelConfig, device: torch.device, world_size: int) -> None:
    """Everything that depends on the device and the install, before the worker registers."""
    cuda = device.type == "cuda"
    if cfg.fp8:
        if not cuda or torch.cuda.get_device_capability(device) < (8, 9):
            raise SpeedConfigError("speed.fp8: needs a CUDA device of compute capability 8.9 or higher (Ada, Hopper)")
        if importlib.util.find_spec("torchao") is None:
            raise SpeedConfigError("speed.fp8: needs torchao (pip install 'dit-worker[fp8]')")
    if cfg.offload != "none" and not cuda:
        raise SpeedConfigError("speed.offload: needs a CUDA device")
    if cfg.compile_mode != "default" and not (cfg.compile or cfg.compile_vae or cfg.compile_text):
        raise SpeedConfigError("speed.compile_mode: set speed.compile, speed.compile_vae or speed.compile_text as well")
    if cfg.compile_scope != "model" and not cfg.compile:
        raise SpeedConfigError("speed.compile_scope: set speed.compile as well")
    if cfg.attention_backend:
        _check_backend(cfg.attention_backend)
    if parallel.mode == "context":
        if world_size < 2:
            raise SpeedConfigError("parallel.mode: 'context' needs at least 2 ranks")
        if parallel.context_kind == "ring" and cfg.attention_backend not in RING_BACKENDS:
            raise SpeedConfigError(
                f"parallel.context_kind: ring needs an attention backend that returns LSE "
                f"({', '.join(RING_BACKENDS)}); speed.attention_backend is {cfg.attention_backend or 'native'!r}")


def _check_backend(name: str) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    try:
        backend = AttentionBackendName(name)
    except ValueError:
        known = ", ".join(b.value for b in AttentionBackendName)
        raise SpeedConfigError(f"speed.attention_backend: unknown backend {name!r}; one of {known}") from None
    try:
        _check_attention_backend_requirements(backend)
    except Exception as e:  # missing kernel package or unsupported torch
        raise SpeedConfigError(f"speed.attention_backend: {name!r} cannot run here: {e}") from None


def place(pipe, cfg: SpeedConfig, device: torch.device) -> None:
    """Puts the pipeline on its device, or sets up offloading to it."""
    if cfg.offload == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif cfg.offload == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    else:
        pipe.to(device)


def before_parallel(pipe, cfg: SpeedConfig) -> list[str]:
    """The switches that change modules. Returns what was applied, for the log."""
    done = []
    transformer = type(pipe.transformer).__name__
    if cfg.fuse_qkv:
        if hasattr(pipe.transformer, "fuse_qkv_projections"):
            pipe.transformer.fuse_qkv_projections()
            done.append("fused QKV")
        else:
            log.info("speed.fuse_qkv skipped: %s cannot fuse its projections", transformer)
    if cfg.channels_last_vae:
        pipe.vae.to(memory_format=torch.channels_last)
        done.append("channels_last VAE")
    if cfg.attention_backend:
        # diffusers sets the backend on processors that dispatch through it; the older ones
        # (PixArt's AttnProcessor2_0) call SDPA themselves and would silently ignore it.
        if any(hasattr(p, "_attention_backend") for p in getattr(pipe.transformer, "attn_processors", {}).values()):
            pipe.transformer.set_attention_backend(cfg.attention_backend)
            done.append(f"attention {cfg.attention_backend}")
        else:
            log.info("speed.attention_backend skipped: %s's attention processors call SDPA directly", transformer)
    if cfg.fp8:
        done.append(quantize_fp8(pipe.transformer, cfg.fp8_scales))
    return done


# Under this many features on either side a linear layer gains less from fp8 than quantizing its
# input costs (torchao's own FLUX benchmark skips them too).
FP8_MIN_FEATURES = 1024
# What fuse_qkv_projections replaces (diffusers keeps the modules, unused).
UNFUSED = {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"}


def fp8_targets(transformer, min_features: int = FP8_MIN_FEATURES) -> list[str]:
    """The linear layers of a FLUX transformer that fp8 can speed up. Left out: the adaLN modulation
    layers (norm1.linear, norm1_context.linear, norm.linear, norm_out.linear), which see one row
    per image, so the matmul is tiny and the quantization of its input is pure cost; the embedders
    (x_embedder, context_embedder, time_text_embed), small and first in the chain; the final
    proj_out; the separate Q, K, V projections an attention with fused projections no longer calls;
    and anything with a side under `min_features`."""
    modules = dict(transformer.named_modules())
    out = []
    for name, module in modules.items():
        if not isinstance(module, torch.nn.Linear):
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = modules.get(parent_name)
        if type(parent).__name__.startswith("AdaLayerNorm") or "embed" in name or name == "proj_out":
            continue
        if getattr(parent, "fused_projections", False) and leaf in UNFUSED:
            continue
        if min(module.in_features, module.out_features) >= min_features:
            out.append(name)
    return out


def quantize_fp8(transformer, scales: str) -> str:
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

    targets = set(fp8_targets(transformer))
    # set_inductor_config=False: torchao's default turns on coordinate-descent tuning for the whole
    # process (the VAE's compile too), the likely cause of a 333 s first compile on an H100.
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow() if scales == "row" else PerTensor(),
                                                       set_inductor_config=False)
    quantize_(transformer, config, filter_fn=lambda _module, fqn: fqn in targets)
    return f"fp8 per-{scales} on {len(targets)} linear layers"


def after_parallel(pipe, cfg: SpeedConfig, fullgraph: bool = True) -> list[str]:
    done = []
    if cfg.compile:
        # fullgraph: a graph break would silently cost most of the gain (context parallelism's
        # hooks need breaks); dynamic=False: the warm-up compiles each (size, batch) the worker
        # serves, so no request pays for a recompile.
        options = dict(fullgraph=fullgraph, dynamic=False, mode=cfg.compile_mode)
        scope = cfg.compile_scope
        if scope == "blocks" and not getattr(pipe.transformer, "_repeated_blocks", None):
            log.info("speed.compile_scope = 'blocks' skipped: %s names no repeated blocks; compiling the whole model",
                     type(pipe.transformer).__name__)
            scope = "model"
        if scope == "blocks":
            pipe.transformer.compile_repeated_blocks(**options)
        else:
            pipe.transformer.compile(**options)
        done.append(f"compiled transformer ({scope}, {cfg.compile_mode})")
    if cfg.compile_vae:
        pipe.vae.decoder.compile(dynamic=False, mode=cfg.compile_mode)
        done.append("compiled VAE decoder")
    if cfg.compile_text:
        # FLUX has two (CLIP, T5), PixArt one (T5).
        for encoder in filter(None, (getattr(pipe, "text_encoder", None), getattr(pipe, "text_encoder_2", None))):
            encoder.compile(dynamic=False, mode=cfg.compile_mode)
        done.append("compiled text encoders")
    return done
