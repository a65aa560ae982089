"""The store in SQL, for both backends (sqlite.py, postgres.py: the connections, the transactions and
a few dialect fragments, database.py's hooks). Its calls are grouped by role, each role an object
over the same database: tasks (submits and reads), workers (registrations and heartbeats), claims,
reports (and outcomes), upkeep (maintenance). Statements are written with `?` placeholders; the
PostgreSQL backend adapts them. The statuses a statement may move a task between come from
lifecycle.TRANSITIONS, and the lease check is lifecycle.lease_held, wherever it is made."""

from __future__ import annotations

from typing import Any

from scheduler.store.claims import SQLClaims
from scheduler.store.database import Database
from scheduler.store.reports import SQLReports
from scheduler.store.tasks import SQLTasks
from scheduler.store.upkeep import SQLUpkeep
from scheduler.store.workers import SQLWorkers


class SQLStore(Database):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.tasks = SQLTasks(self)
        self.workers = SQLWorkers(self)
        self.claims = SQLClaims(self)
        self.reports = SQLReports(self)
        self.upkeep = SQLUpkeep(self)
