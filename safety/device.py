"""Where a safety model runs: "cpu", "cuda", "cuda:N", or "auto" (the GPU when there is one)."""

from __future__ import annotations

import contextlib


def resolve_device(name: str) -> str:
    if name != "auto":
        return name
    import torch  # kept out of import time

    return "cuda" if torch.cuda.is_available() else "cpu"


def weights_mb(module) -> float:
    """What a torch model's parameters and buffers take on their device, in MiB."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def own_stream(device: str):
    """A check's own CUDA stream on `device`, or None off CUDA. PyTorch's streams do not wait for
    the legacy default stream the engine generates on, so a check's small kernels run beside the
    transformer's instead of queueing behind a whole denoising step, and generation never waits
    for a check. Results leave the stream through `.cpu()`, which waits for it."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.Stream(device=device)


def on_stream(stream):
    """The context that makes `stream` current on this thread (nothing where it is None)."""
    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(stream)
