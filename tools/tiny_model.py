"""The tiny random-weight FLUX pipeline for the demo and the tests, saved to a folder
(`dit-worker make-tiny-model DIR`).

The folder written by `save_pretrained` loads through the same `FluxPipeline.from_pretrained` path
as the real model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.model.architectures import build_pipeline


def build_tiny_pipeline(seed: int = 0):
    return build_pipeline("tiny", seed)


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    directory = Path(directory)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    build_tiny_pipeline(seed).save_pretrained(directory)
    return directory


def main(argv: list[str]) -> int:
    """`dit-worker make-tiny-model DIR`, registered as a dit-worker plug-in command."""
    p = argparse.ArgumentParser(prog="dit-worker make-tiny-model", description=__doc__)
    p.add_argument("directory")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(make_tiny_model(args.directory, args.seed))
    return 0
