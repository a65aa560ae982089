"""The tiny random-weight pipelines for the demo and the tests, saved to a folder
(`dit-worker make-tiny-model DIR [--arch tiny|tiny-pixart]`): FLUX by default, or PixArt-Sigma,
the second family.

The folder written by `save_pretrained` loads through the same `DiffusionPipeline.from_pretrained`
path as the real model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.model.architectures import build_pipeline

TINY_ARCHS = ("tiny", "tiny-pixart")


def build_tiny_pipeline(seed: int = 0, arch: str = "tiny"):
    return build_pipeline(arch, seed)


def make_tiny_model(directory: str | Path, seed: int = 0, arch: str = "tiny") -> Path:
    directory = Path(directory)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    build_tiny_pipeline(seed, arch).save_pretrained(directory)
    return directory


def make_tiny_lora(model_dir: str | Path, out: str | Path, rank: int = 4, seed: int = 0,
                   targets: tuple[str, ...] = ("to_q", "to_k", "to_v")) -> Path:
    """A LoRA adapter for the transformer of the FLUX model saved in `model_dir`, built with peft,
    its weights random and non-zero (peft's default leaves B at zero, which changes nothing), saved
    as diffusers saves one: `out` (a .safetensors file)."""
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel.from_pretrained(Path(model_dir) / "transformer")
    transformer = inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets),
                                                     init_lora_weights=False), transformer)
    out = Path(out)
    FluxPipeline.save_lora_weights(out.parent, transformer_lora_layers=get_peft_model_state_dict(transformer),
                                   weight_name=out.name)
    return out


def main(argv: list[str]) -> int:
    """`dit-worker make-tiny-model DIR [--arch tiny|tiny-pixart]`, registered as a dit-worker plug-in
    command."""
    p = argparse.ArgumentParser(prog="dit-worker make-tiny-model", description=__doc__)
    p.add_argument("directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=TINY_ARCHS, default="tiny",
                   help="tiny: FLUX (the default); tiny-pixart: PixArt-Sigma")
    args = p.parse_args(argv)
    print(make_tiny_model(args.directory, args.seed, args.arch))
    return 0
