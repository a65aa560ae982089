"""Honest back-pressure for clients: a rate limit per client (a token bucket per bearer token, or per
address when auth is off) and the queue-depth limit, both answered 429 with a Retry-After the client
can act on. The queue is bounded twice: by depth (`max_queued`), and by the wait a new task would
have (`max_queue_wait_s`): its priority's lane and those above it against the fleet's end rate,
the tasks ended per second over the last 30 s. A 429 then says, in Retry-After, how long the tasks
already ahead need to drain: what a task let in now would wait."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_RETRY_AFTER_S = 3600
IDLE_FLEET_RETRY_S = 60  # nothing ended lately: no pace to estimate from


@dataclass
class Bucket:
    tokens: float
    at: float


@dataclass
class RateLimit:
    """`rate` tasks per second per client, with bursts up to `burst`; 0 switches it off."""

    rate: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, Bucket] = field(default_factory=dict)

    def take(self, client: str, n: int = 1) -> float:
        """0 when `n` tasks may go now (and they are counted), else the seconds until they may."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        b = self._buckets.get(client) or Bucket(self.burst, now)
        b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
        b.at = now
        self._buckets[client] = b
        if n > self.burst:
            return math.inf  # never fits: the caller refuses it outright
        if b.tokens >= n:
            b.tokens -= n
            return 0.0
        if len(self._buckets) > 100_000:  # forget idle clients (full buckets) so memory stays bounded
            self._buckets = {k: v for k, v in self._buckets.items() if v.tokens < self.burst}
        return (n - b.tokens) / self.rate


def client_key(authorization: str | None, address: str | None) -> str:
    """Who is asking: a digest of the bearer token (never the token itself), else the address."""
    if authorization:
        return "t:" + hashlib.sha256(authorization.encode()).hexdigest()[:32]
    return f"a:{address or '?'}"


def retry_after_s(excess: int, ended_per_s: float) -> int:
    """Seconds until `excess` tasks of room are likely, at the fleet's recent end rate."""
    if ended_per_s <= 0:
        return IDLE_FLEET_RETRY_S
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(excess / ended_per_s)))
