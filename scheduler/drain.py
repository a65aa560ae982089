"""What the fleet drains, and so how long a new task would wait: the arithmetic that admission, the
queue's figures and the metrics share (the store measures the rate; this module has no I/O)."""

from __future__ import annotations

from collections.abc import Mapping

DRAIN_WINDOW_S = 30.0  # the drain rate is measured over this much of the recent past
DRAIN_MIN_TASKS = 10  # fewer ended in it: no rate to go by


def queue_wait_s(depth: Mapping[int, int], priority: int, n: int, drain_per_s: float) -> float | None:
    """Seconds the last of `n` tasks of `priority` submitted now would wait before a worker takes it:
    the queued tasks of its priority and above are served first, at the drain rate. None when
    nothing has drained lately (no rate to go by)."""
    if drain_per_s <= 0:
        return None
    return (ahead(depth, priority) + n) / drain_per_s


def ahead(depth: Mapping[int, int], priority: int) -> int:
    """Queued tasks a new task of `priority` waits behind: its own lane (first in, first out) and higher."""
    return sum(v for p, v in depth.items() if p >= priority)
