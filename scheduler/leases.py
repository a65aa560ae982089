"""Lease arithmetic: pure functions, so the rules are unit-tested apart from SQL."""

from __future__ import annotations

from typing import Literal

NextStatus = Literal["queued", "failed"]


def deadline(now: float, ttl_s: float) -> float:
    return now + ttl_s


def after_expiry(attempts: int, max_attempts: int) -> NextStatus:
    """An expired lease requeues the task unless it has used all its attempts (poison jobs)."""
    return "queued" if attempts < max_attempts else "failed"


def after_failure(retryable: bool, attempts: int, max_attempts: int) -> NextStatus:
    """A failure report requeues the task only when the worker says a retry can help."""
    return "queued" if retryable and attempts < max_attempts else "failed"
