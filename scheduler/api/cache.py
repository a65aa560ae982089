"""A value read at most every so often, for reads too costly to make per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Cached(Generic[T]):
    """The last value `read` gave, read again once older than `max_age_s`. One read at a time:
    callers that come meanwhile wait for it instead of reading too."""

    def __init__(self, initial: T) -> None:
        self._value = initial
        self._at = float("-inf")
        self._reading = asyncio.Lock()

    async def get(self, read: Callable[[], Awaitable[T]], max_age_s: float) -> T:
        async with self._reading:
            if time.monotonic() - self._at >= max_age_s:
                self._value = await read()
                self._at = time.monotonic()
        return self._value
