"""FLUX's prompt embeddings (T5 + CLIP), each prompt on its own row, the repeated ones from an LRU
cache of `speed.prompt_cache_size` entries (0: none kept)."""

from __future__ import annotations

from collections import OrderedDict

import torch


class PromptCache:
    def __init__(self, pipe, max_sequence_length: int, size: int = 0) -> None:
        self.pipe = pipe
        self.max_sequence_length = max_sequence_length
        self.size = size
        self.hits = 0
        self._kept: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def embed(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeds, pooled) of one prompt; a repeated prompt's from the cache."""
        if (hit := self._kept.get(prompt)) is not None:
            self._kept.move_to_end(prompt)
            self.hits += 1
            return hit
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompt, prompt_2=None, device=self.pipe._execution_device,
            max_sequence_length=self.max_sequence_length)
        # Copies: a text encoder compiled with CUDA graphs overwrites its outputs on the next call,
        # and these outlive it (the cache, a batch's other prompts). 2 MB, microseconds.
        embeds, pooled = embeds.clone(), pooled.clone()
        if self.size:
            self._kept[prompt] = (embeds, pooled)
            if len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return embeds, pooled
