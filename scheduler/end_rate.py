"""The fleet's end rate (tasks ended per second lately), and so how long a new task would wait: the
arithmetic that the submit gate, the queue's figures and the metrics share (the store measures the
rate; this module has no I/O)."""

from __future__ import annotations

from collections.abc import Mapping

END_RATE_WINDOW_S = 30.0  # the end rate is measured over this much of the recent past
END_RATE_MIN_TASKS = 10  # fewer ended in it: no rate to go by


def queue_wait_s(depth: Mapping[int, int], priority: int, n: int, ended_per_s: float) -> float | None:
    """Seconds the last of `n` tasks of `priority` submitted now would wait before a worker takes it:
    the queued tasks of its priority and above are served first, at the end rate. None when
    nothing has ended lately (no rate to go by)."""
    if ended_per_s <= 0:
        return None
    return (ahead(depth, priority) + n) / ended_per_s


def ahead(depth: Mapping[int, int], priority: int) -> int:
    """Queued tasks a new task of `priority` waits behind: its own lane (first in, first out) and higher."""
    return sum(v for p, v in depth.items() if p >= priority)
