"""Adapter files made at test time: safetensors of LoRA factors (and what is not one)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file


def lora_file(path: Path, rank: int = 4, layers: int = 2, style: str = "peft", fill: float = 0.01) -> Path:
    """A LoRA adapter's weights in peft's layout (lora_A / lora_B) or kohya's (lora_down / lora_up)."""
    down, up = ("lora_A", "lora_B") if style == "peft" else ("lora_down", "lora_up")
    tensors = {}
    for i in range(layers):
        tensors[f"transformer.blocks.{i}.attn.to_q.{down}.weight"] = torch.full((rank, 32), fill)
        tensors[f"transformer.blocks.{i}.attn.to_q.{up}.weight"] = torch.full((32, rank), fill)
    save_file(tensors, str(path))
    return path
