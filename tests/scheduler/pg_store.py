"""A PostgresStore on a fresh database of the session's server, and a way to run a scenario on a
loop the store has opened (the app's async path: group commit, the announcer)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from scheduler.store.postgres import PostgresStore


def fresh_store(postgres, pool_size: int = 4) -> Iterator[PostgresStore]:
    store = PostgresStore(postgres.fresh(), pool_size=pool_size)
    try:
        yield store
    finally:
        store.close()


def on_loop(store: PostgresStore, call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()`'s result, awaited on a loop the store has opened, then closed."""
    async def run():
        await store.aopen()
        try:
            return await call()
        finally:
            await store.aclose()

    return asyncio.run(run())
