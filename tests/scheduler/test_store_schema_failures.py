"""The schema's failure paths: a migration that fails leaves the database as it was, on both backends;
an unfinished statement is refused before anything runs; and a schema that differs between the two
backends is told apart by the comparison test_store_schema makes."""

from __future__ import annotations

import shutil
import sqlite3
from importlib import resources

import psycopg
import pytest
from psycopg.rows import dict_row

from scheduler.store import SQLiteStore, migrate
from scheduler.store.postgres import PostgresStore
from tests.scheduler.test_store_schema import describe_postgres, describe_sqlite

LATEST = migrate.migrations()[-1].version  # the package's own; a test's come after


def test_a_failing_migration_leaves_the_database_as_it_was(make_store, tmp_path):
    store = make_store()
    dialect = "sqlite" if isinstance(store, SQLiteStore) else "postgres"
    (tmp_path / f"{LATEST + 1:04d}_extra.sql").write_text("CREATE TABLE extra (id TEXT PRIMARY KEY);\n")
    (tmp_path / f"{LATEST + 2:04d}_broken.sql").write_text("ALTER TABLE no_such_table ADD COLUMN x TEXT;\n")
    with pytest.raises(Exception, match="no_such_table"), store._tx() as db:
        migrate.apply(db, dialect, tmp_path)
    with store._tx() as db:
        versions = {r["version"] for r in db.execute("SELECT version FROM schema_migrations").fetchall()}
        assert versions == set(range(1, LATEST + 1))
        assert migrate.apply(db, dialect) == []  # the package's own are all there
    with pytest.raises(Exception, match="extra"), store._tx() as db:
        db.execute("SELECT * FROM extra")


def test_a_statement_without_its_semicolon_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "0001_unfinished.sql").write_text("-- a comment; not the end\nCREATE TABLE t (s TEXT DEFAULT ';'\n")
    [m] = migrate.migrations(tmp_path)
    with pytest.raises(ValueError, match="without its closing"):
        m.statements("sqlite")


def test_a_difference_between_the_backends_is_found(postgres, tmp_path):
    folder = tmp_path / "migrations"
    shutil.copytree(str(resources.files("scheduler.store").joinpath("migrations")), folder)
    (folder / f"{LATEST + 1:04d}_sqlite_only.sql").write_text("CREATE INDEX tasks_created ON tasks (created_at);\n")
    db = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    db.row_factory = sqlite3.Row
    migrate.apply(db, "sqlite", folder)
    url = postgres.fresh()
    PostgresStore(url, pool_size=2).close()
    with psycopg.connect(url, row_factory=dict_row) as pg:
        on_sqlite, on_postgres = describe_sqlite(db), describe_postgres(pg)
    assert on_sqlite["workers"] == on_postgres["workers"]
    assert set(on_sqlite["tasks"]["indexes"]) - set(on_postgres["tasks"]["indexes"]) == {"tasks_created"}
