"""Where a safety model runs: "cpu", "cuda", "cuda:N", or "auto" (the GPU when there is one)."""

from __future__ import annotations


def resolve_device(name: str) -> str:
    if name != "auto":
        return name
    import torch  # kept out of import time

    return "cuda" if torch.cuda.is_available() else "cpu"


def weights_mb(module) -> float:
    """What a torch model's parameters and buffers take on their device, in MiB."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20
