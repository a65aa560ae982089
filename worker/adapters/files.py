"""What an adapter file must be before any rank loads it: safetensors (a JSON header and raw
tensors: nothing in it runs when read, unlike a pickle), of LoRA weights, of a rank the worker
accepts. Read from the header alone, without loading a tensor."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from worker.adapters.sources import AdapterRefused

MAX_HEADER = 100 << 20  # safetensors' own bound on its JSON header
# The low-rank factors' names in the layouts diffusers loads: peft's lora_A / lora_B, kohya's
# lora_down / lora_up. The down (A) factor is (rank, in_features).
_DOWN = re.compile(r"(lora_A|lora_down)(\.[^.]+)?\.weight$")


@dataclass(frozen=True)
class AdapterFile:
    rank: int  # the largest rank of its layers
    tensors: int


def inspect_file(path: Path, field: str, max_rank: int) -> AdapterFile:
    """The file's rank and tensor count; AdapterRefused naming `field` when it is not a
    safetensors file of LoRA weights within `max_rank`."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise AdapterRefused(f"{field}: not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise AdapterRefused(f"{field}: not a safetensors file (a pickle or another format; only safetensors "
                                 "is loaded)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            raise AdapterRefused(f"{field}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise AdapterRefused(f"{field}: not a safetensors file (its header is not an object)")
    ranks = []
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape, (_, stop) = info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise AdapterRefused(f"{field}: not a safetensors file (tensor {name!r} is not described)") from None
        end = max(end, stop)
        if _DOWN.search(name) and isinstance(shape, list) and shape:
            ranks.append(int(shape[0]))
    if end != size - 8 - n:
        raise AdapterRefused(f"{field}: a damaged safetensors file (its tensors end at byte {end} of "
                             f"{size - 8 - n})")
    if not ranks:
        raise AdapterRefused(f"{field}: holds no LoRA weights (no lora_A or lora_down tensors)")
    if max(ranks) > max_rank:
        raise AdapterRefused(f"{field}: rank {max(ranks)} is above lora.max_rank ({max_rank})")
    return AdapterFile(max(ranks), len(header) - ("__metadata__" in header))
