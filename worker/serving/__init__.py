"""Rank 0: the serve loop (coordinator) and what it alone does: lease and admit tasks, post-process
images, report to the scheduler, heartbeat. Uses ranks, model, storage, safety and protocol."""
