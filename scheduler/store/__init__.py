"""The scheduler's durable state behind one interface (base.Store, its calls grouped by role:
store.tasks, .workers, .claims, .reports, .upkeep): SQLite, the embedded default (sqlite.py), or
PostgreSQL for several scheduler processes (postgres.py), with one schema (migrations/). `open_store`
picks the backend from the --db value."""

from __future__ import annotations

from pathlib import Path

from scheduler.store.base import Cancelled, Claims, Moved, Refused, Reports, Store, Tasks, Unknown, Upkeep, Workers
from scheduler.store.sqlite import SQLiteStore

__all__ = ["Cancelled", "Claims", "Moved", "Refused", "Reports", "SQLiteStore", "Store", "Tasks", "Unknown", "Upkeep",
           "Workers", "open_store"]


def open_store(db: str | Path, **options) -> Store:
    """postgresql://...: PostgreSQL (psycopg, from the `postgres` extra); a file path: SQLite
    (created with its folder). Options: lease_ttl_s, max_attempts, liveness_s, worker_retention_s (worker
    registrations), task_retention_s (ended tasks);
    pool_size, PostgreSQL's connections per pool (ignored by SQLite); busy_timeout_s, SQLite's wait for
    another process's lock (ignored by PostgreSQL)."""
    if str(db).startswith(("postgresql://", "postgres://")):
        from scheduler.store.postgres import PostgresStore  # psycopg only where it is used

        options.pop("busy_timeout_s", None)  # the server's locks, not a file's
        return PostgresStore(str(db), **options)
    options.pop("pool_size", None)  # no pool in-process
    path = Path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(path, **options)
