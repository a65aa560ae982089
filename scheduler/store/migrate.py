"""One schema for both backends: the numbered files in migrations/, applied in order to SQLite and
PostgreSQL alike, each once (`schema_migrations` records them), in the caller's transaction, which
keeps other scheduler processes out (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock). They
are written in PostgreSQL's words; SQLITE_WORDS is every place where SQLite's differ."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Literal

log = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgres"]

# INTEGER PRIMARY KEY is SQLite's rowid (AUTOINCREMENT: never reused, so the queue stays in
# submission order after a purge); REAL is its 8-byte float, as the files made before the
# migrations declared it.
SQLITE_WORDS = {"BIGSERIAL PRIMARY KEY": "INTEGER PRIMARY KEY AUTOINCREMENT", "DOUBLE PRECISION": "REAL"}

TABLE = ("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
         " applied_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP)")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    def statements(self, dialect: Dialect) -> list[str]:
        """Its statements in `dialect`'s words, without their comments."""
        text = self.text
        if dialect == "sqlite":
            for postgres, sqlite in SQLITE_WORDS.items():
                text = text.replace(postgres, sqlite)
        return _split(text)


def migrations(folder: Traversable | None = None) -> list[Migration]:
    """The migrations in `folder` (the package's own by default), in order."""
    folder = folder or resources.files("scheduler.store").joinpath("migrations")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [Migration(int(f.name.split("_", 1)[0]), f.name, f.read_text()) for f in files]


def apply(db: Any, dialect: Dialect, folder: Traversable | None = None) -> list[int]:
    """Applies the migrations `db` lacks, in order; their versions."""
    db.execute(TABLE)
    done = {r["version"] for r in db.execute("SELECT version FROM schema_migrations").fetchall()}
    new = [m for m in migrations(folder) if m.version not in done]
    for m in new:
        log.info("applying migration %s", m.name)
        for statement in m.statements(dialect):
            db.execute(statement)
        record(db, m)
    return [m.version for m in new]


def record(db: Any, m: Migration) -> None:
    db.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", (m.version, m.name))


def _split(text: str) -> list[str]:
    code = "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("--"))
    out, statement = [], ""
    for line in code.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):  # knows quotes: a `;` inside a string ends nothing
            out.append(statement.strip())
            statement = ""
    if statement.strip():
        raise ValueError(f"a statement without its closing ';': {statement.strip()[:80]!r}")
    return out
