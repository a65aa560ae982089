"""A group whose COMMIT fails: every call in it fails, nothing of it is stored, and the store goes on."""

from __future__ import annotations

import asyncio
import sqlite3

from protocol import SubmitTask
from scheduler.store import SQLiteStore


class FailingCommit:
    """The store's write connection, whose next COMMIT fails (a full disk)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db, self.armed = db, True

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and self.armed:
            self.armed = False
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_failed_commit_fails_every_call_of_its_group_and_the_next_group_works(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    real = store._db

    async def scenario():
        await store.aopen()
        store._db = FailingCommit(real)
        out = await asyncio.gather(*[store.acall(store.tasks.submit, SubmitTask(input={"prompt": f"{i}"}))
                                     for i in range(3)], return_exceptions=True)
        assert all(isinstance(o, sqlite3.OperationalError) for o in out)
        await store.acall(store.tasks.submit, SubmitTask(input={"prompt": "after"}))
        await store.aclose()

    asyncio.run(scenario())
    store._db = real
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT input FROM tasks")] == ['{"prompt": "after"}']
    store.close()
