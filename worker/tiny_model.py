"""The tiny random-weight FLUX pipeline for the demo and the tests, saved to a folder.

The folder written by `save_pretrained` loads through the same `FluxPipeline.from_pretrained` path
as the real model.
"""

from __future__ import annotations

from pathlib import Path

from worker.architectures import build_pipeline


def build_tiny_pipeline(seed: int = 0):
    return build_pipeline("tiny", seed)


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    directory = Path(directory)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    build_tiny_pipeline(seed).save_pretrained(directory)
    return directory
