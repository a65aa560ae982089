"""A stand-in for SQLiteStore's write connection that runs a hook before each COMMIT: the group
commit's tests hold a COMMIT or make it fail (a full disk)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable


class OnCommit:
    def __init__(self, db: sqlite3.Connection, hook: Callable[[], None]) -> None:
        self._db, self._hook = db, hook

    def execute(self, sql: str, *args):
        if sql == "COMMIT":
            self._hook()
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)
