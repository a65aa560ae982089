"""A group whose COMMIT fails: every call in it fails, nothing of it is stored, and the store goes on."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

from protocol import SubmitTask
from scheduler.store import SQLiteStore
from tests.scheduler.commits import OnCommit


def disk_full_once() -> Callable[[], None]:
    """A COMMIT hook: the first COMMIT fails as on a full disk, the others go through."""
    armed = [True]

    def hook() -> None:
        if armed:
            armed.clear()
            raise sqlite3.OperationalError("database or disk is full")

    return hook


def test_a_failed_commit_fails_every_call_of_its_group_and_the_next_group_works(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    real = store._db

    async def scenario():
        await store.aopen()
        store._db = store._group._db = OnCommit(real, disk_full_once())
        out = await asyncio.gather(*[store.acall(store.tasks.submit, SubmitTask(input={"prompt": f"{i}"}))
                                     for i in range(3)], return_exceptions=True)
        assert all(isinstance(o, sqlite3.OperationalError) for o in out)
        await store.acall(store.tasks.submit, SubmitTask(input={"prompt": "after"}))
        await store.aclose()

    asyncio.run(scenario())
    store._db = store._group._db = real
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT input FROM tasks")] == ['{"prompt": "after"}']
    store.close()
