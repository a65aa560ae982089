"""One schema (scheduler/store/migrate.py): the numbered migrations make the same tables, columns,
keys and indexes on SQLite and on PostgreSQL, and an SQLite file made by the inline schema that came
before them is adopted: its data kept, its schema made what the migrations make."""

from __future__ import annotations

import re
import sqlite3

import psycopg
from psycopg.rows import dict_row

from protocol import Heartbeat
from scheduler.store import SQLiteStore, migrate
from scheduler.store.postgres import PostgresStore
from tests.scheduler.test_store import ok, worker

# What SQLite and PostgreSQL call the same kind of column (SQLite's INTEGER holds 64 bits).
TYPES = {"integer": "integer", "bigint": "integer", "text": "text", "real": "real", "double precision": "real",
         "timestamptz": "timestamp", "timestamp with time zone": "timestamp"}


def test_sqlite_and_postgresql_end_with_the_same_schema(postgres, tmp_path):
    SQLiteStore(tmp_path / "s.db").close()
    url = postgres.fresh()
    PostgresStore(url, pool_size=2).close()
    with sqlite3.connect(tmp_path / "s.db") as lite, psycopg.connect(url, row_factory=dict_row) as pg:
        on_sqlite, on_postgres = describe_sqlite(lite), describe_postgres(pg)
    assert set(on_sqlite) == {"tasks", "workers", "worker_models", "worker_adapters", "schema_migrations"}
    assert len(on_sqlite["tasks"]["indexes"]) == 8 and on_sqlite["tasks"]["unique"] == {("id",), ("idempotency_key",)}
    for table in on_sqlite:
        assert on_sqlite[table] == on_postgres[table], table


def test_an_sqlite_file_from_the_inline_schema_keeps_its_tasks_and_gets_the_migrations_schema(tmp_path, clock):
    old = inline_file(tmp_path / "old.db", INLINE_SCHEMA + INLINE_ADDED + INLINE_INDEXES)
    old.execute("INSERT INTO tasks (id, input, priority, status, max_attempts, created_at, updated_at)"
                " VALUES ('t-old', '{\"prompt\": \"p\"}', 0, 'queued', 3, 1.0, 1.0)")
    old.commit()
    old.close()
    s = SQLiteStore(tmp_path / "old.db", clock=clock)
    assert s.tasks.get("t-old").input == {"prompt": "p"}
    w = worker(s)
    (lease,) = s.claims.claim(w, 1)
    assert s.reports.report("t-old", ok(lease.lease_token, w)).status == "succeeded"
    s.close()
    SQLiteStore(tmp_path / "fresh.db").close()
    with sqlite3.connect(tmp_path / "old.db") as adopted, sqlite3.connect(tmp_path / "fresh.db") as fresh:
        versions = [v for (v,) in adopted.execute("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == [m.version for m in migrate.migrations()]
        assert describe_sqlite(adopted) == describe_sqlite(fresh)


def test_an_sqlite_database_from_before_the_worker_columns_is_migrated(tmp_path, clock):
    old = INLINE_SCHEMA.replace(",\n    warnings TEXT NOT NULL DEFAULT '[]',\n    counters TEXT NOT NULL DEFAULT '{}'", "")
    assert "warnings" not in old
    inline_file(tmp_path / "old.db", old).close()
    s = SQLiteStore(tmp_path / "old.db", clock=clock)
    wid = worker(s)
    s.workers.heartbeat(wid, Heartbeat(status="ready", timestamp=1.0, counters={"n": 1}))
    assert s.workers.workers()[0].counters == {"n": 1}
    s.close()


def inline_file(path, script: str) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.executescript(script)
    return db


# ---------------------------------------------------------------- the schema as each database says it

def describe_sqlite(db: sqlite3.Connection) -> dict:
    tables = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                        " AND name NOT LIKE 'sqlite_%'")]
    return {t: _sqlite_table(db, t) for t in tables}


def _sqlite_table(db: sqlite3.Connection, table: str) -> dict:
    (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    columns, key = {}, []
    for _, name, kind, notnull, default, pk in db.execute(f"PRAGMA table_info({table})"):
        serial = pk and kind.upper() == "INTEGER" and "AUTOINCREMENT" in sql.upper()
        columns[name] = (TYPES[kind.lower()], bool(notnull or pk), "serial" if serial else _default(default))
        key += [(pk, name)] if pk else []
    unique, indexes = set(), {}
    for _, name, is_unique, origin, _ in db.execute(f"PRAGMA index_list({table})"):
        cols = tuple(c + (" desc" if desc else "") for _, _, c, desc, _, is_key in
                     db.execute(f"PRAGMA index_xinfo({name})") if is_key)
        if origin == "u":
            unique.add(cols)
        elif origin == "c":
            (made,) = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            where = re.search(r"\bWHERE\b(.*)$", made, re.S | re.I)
            indexes[name] = (bool(is_unique), cols, _predicate(where.group(1) if where else None))
    return {"columns": columns, "primary_key": tuple(n for _, n in sorted(key)), "unique": unique, "indexes": indexes}


def describe_postgres(db: psycopg.Connection) -> dict:
    tables = [r["table_name"] for r in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
    return {t: _postgres_table(db, t) for t in tables}


def _postgres_table(db: psycopg.Connection, table: str) -> dict:
    columns = {r["column_name"]: (TYPES[r["data_type"]], r["is_nullable"] == "NO", _default(r["column_default"]))
               for r in db.execute("SELECT column_name, data_type, is_nullable, column_default"
                                   " FROM information_schema.columns WHERE table_name = %s", (table,))}
    rows = db.execute(
        "SELECT c.relname AS name, ix.indisunique AS is_unique, ix.indisprimary AS pk,"
        " pg_get_expr(ix.indpred, ix.indrelid) AS predicate,"
        " (SELECT contype FROM pg_constraint WHERE conindid = ix.indexrelid) AS constraint_type,"
        " ARRAY(SELECT pg_get_indexdef(ix.indexrelid, k + 1, true)"
        "       || CASE WHEN ix.indoption[k] & 1 = 1 THEN ' desc' ELSE '' END"
        "       FROM generate_subscripts(ix.indkey, 1) AS k ORDER BY k) AS cols"
        " FROM pg_index ix JOIN pg_class c ON c.oid = ix.indexrelid WHERE ix.indrelid = %s::regclass",
        (table,)).fetchall()
    key = next((tuple(r["cols"]) for r in rows if r["pk"]), ())
    unique = {tuple(r["cols"]) for r in rows if r["constraint_type"] == "u"}
    indexes = {r["name"]: (r["is_unique"], tuple(r["cols"]), _predicate(r["predicate"]))
               for r in rows if r["constraint_type"] is None}
    return {"columns": columns, "primary_key": key, "unique": unique, "indexes": indexes}


def _default(text: str | None) -> str | None:
    """A column default as both can say it: casts dropped, a sequence is `serial`."""
    if text is None:
        return None
    return "serial" if text.startswith("nextval(") else re.sub(r"::[a-z ]+", "", text)


def _predicate(text: str | None) -> str | None:
    """A partial index's condition as both can say it: PostgreSQL's `= ANY (ARRAY[...])` is `IN (...)`,
    casts, enclosing parentheses and those around each comparison dropped, lower case, single spaces."""
    if text is None:
        return None
    text = re.sub(r"::[a-z ]+", "", text)
    text = re.sub(r"= ANY \(ARRAY\[(.*?)\]\)", r"IN (\1)", text)
    text = " ".join(text.lower().split())
    text = re.sub(r"\(([a-z_]+ (?:=|<>) '[^']*')\)", r"\1", text)  # (a = 'x') and (b <> ''): no parentheses
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


# ---------------------------------------------------------------- the inline schema, as its last release wrote it

INLINE_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    input TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    worker_id TEXT,
    lease_token TEXT,
    lease_deadline REAL,
    result TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS tasks_queue ON tasks (status, priority DESC, seq);
CREATE INDEX IF NOT EXISTS tasks_lease ON tasks (status, lease_deadline);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    status TEXT NOT NULL,
    in_flight TEXT NOT NULL DEFAULT '[]',
    registered_at REAL NOT NULL,
    last_heartbeat REAL,
    warnings TEXT NOT NULL DEFAULT '[]',
    counters TEXT NOT NULL DEFAULT '{}',
    safety_policy TEXT
);
"""
# The columns it added at open to files made before them, and its later indexes.
INLINE_ADDED = """
ALTER TABLE tasks ADD COLUMN cancel_requested_at REAL;
ALTER TABLE tasks ADD COLUMN webhook TEXT;
ALTER TABLE tasks ADD COLUMN webhook_due REAL;
ALTER TABLE tasks ADD COLUMN webhook_attempts TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN node_id TEXT;
ALTER TABLE workers ADD COLUMN limits TEXT;
"""
INLINE_INDEXES = """
CREATE INDEX IF NOT EXISTS workers_node ON workers (node_id);
CREATE INDEX IF NOT EXISTS tasks_worker ON tasks (worker_id, status);
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_webhook_due ON tasks (webhook_due) WHERE webhook_due IS NOT NULL;
"""
