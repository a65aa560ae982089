"""The scheduler's durable state behind one interface (base.Store): SQLite, the embedded default
(sqlite.py). `open_store` picks the backend from the --db value."""

from __future__ import annotations

from pathlib import Path

from scheduler.store.base import Conflict, NotFound, Store
from scheduler.store.sqlite import SQLiteStore

__all__ = ["Conflict", "NotFound", "SQLiteStore", "Store", "open_store"]


def open_store(db: str | Path, *, lease_ttl_s: float = 60.0, max_attempts: int = 3) -> Store:
    """A file path: SQLite (created with its folder)."""
    path = Path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(path, lease_ttl_s=lease_ttl_s, max_attempts=max_attempts)
