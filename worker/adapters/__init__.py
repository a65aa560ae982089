"""LoRA adapters from where a task says (input.loras), as the operator allows: the source's checks
(sources.py), the file's (files.py: safetensors only, size, rank, sha256) and the node's disk cache
that the ranks of a node share (cache.py: each file fetched once, least recently used evicted
under a byte budget). The model side, loading them into a pipeline, is worker.model's."""

from worker.adapters.cache import AdapterCache, CachedAdapter
from worker.adapters.files import AdapterFile, inspect_file
from worker.adapters.sources import AdapterRefused, AdapterUnavailable, Source, resolve

__all__ = ["AdapterCache", "AdapterFile", "AdapterRefused", "AdapterUnavailable", "CachedAdapter", "Source",
           "inspect_file", "resolve"]
