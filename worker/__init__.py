"""dit-worker: a torchrun-launched, stateless worker serving DiT text-to-image models from a task queue."""
