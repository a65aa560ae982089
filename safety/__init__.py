"""Content safety on rank 0: the prompt check before the GPU, the image and quality checks before
anything is stored. `Guard.load(cfg.safety)` is the one entry point."""
