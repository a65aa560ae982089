"""Custom safety backends for the tests, loaded by name (`safety.*.custom.factory`) like a user's own.
Each returns an object with check(items) -> list[Verdict]."""

from __future__ import annotations

import time

from safety.verdicts import Verdict


class _Backend:
    name = "test"

    def __init__(self, behaviour, healthy_calls: int = 0) -> None:
        self._behaviour = behaviour
        self._healthy = healthy_calls  # calls that pass first, e.g. the start-up self-test
        self.calls = 0

    def check(self, items):
        self.calls += 1
        if self.calls <= self._healthy:
            return [Verdict(False, self.name) for _ in items]
        return self._behaviour(items)


def _raise(items):
    raise RuntimeError("classifier exploded")


def raising(healthy_calls: int = 1) -> _Backend:
    """Passes the self-test, then raises on every call: a model that broke after start-up."""
    return _Backend(_raise, healthy_calls)


def slow(seconds: float = 5.0, healthy_calls: int = 1) -> _Backend:
    def sleep_then_pass(items):
        time.sleep(seconds)
        return [Verdict(False, "slow") for _ in items]

    return _Backend(sleep_then_pass, healthy_calls)


def wrong_count(healthy_calls: int = 1) -> _Backend:
    return _Backend(lambda items: [], healthy_calls)


def flag_all() -> _Backend:
    return _Backend(lambda items: [Verdict(True, "test", {"all": 1.0}, "all", 1.0) for _ in items])


def not_a_check():
    return object()
