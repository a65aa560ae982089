"""Where a safety model runs: "cpu", "cuda", "cuda:N", or "auto" (the GPU when there is one)."""

from __future__ import annotations


def resolve_device(name: str) -> str:
    if name != "auto":
        return name
    import torch  # kept out of import time

    return "cuda" if torch.cuda.is_available() else "cpu"
