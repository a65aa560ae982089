"""The task lifecycle as data (scheduler/store/lifecycle.py): TRANSITIONS covers the protocol's
statuses, its final ones are the protocol's, the guards built from it are the partial indexes' own
conditions and stop a move it does not list, and the one lease check admits only the current lease."""

from __future__ import annotations

import sqlite3
from typing import get_args

import pytest

from protocol import FINAL_STATUSES, TaskStatus
from scheduler.store import schema
from scheduler.store.lifecycle import (
    ENDED,
    HELD,
    TRANSITIONS,
    end_cancelled,
    lease_held,
    release,
    sources,
    status_in,
)
from scheduler.store.plans import one
from tests.scheduler.test_store import submit


@pytest.fixture
def store(make_store):
    return make_store(lease_ttl_s=10.0, max_attempts=2)


def test_every_status_is_listed_and_the_final_ones_are_the_protocols():
    assert set(TRANSITIONS) == set(get_args(TaskStatus))
    assert all(set(nxt) <= set(TRANSITIONS) and status not in nxt for status, nxt in TRANSITIONS.items())
    assert ENDED == FINAL_STATUSES
    assert HELD == ("leased", "processing") and sources("leased") == ("queued",)


def test_the_guards_are_the_partial_indexes_conditions():
    """Written alike, so the planners of both databases use those indexes for the guarded statements."""
    first = "\n".join(schema.migrations()[0].statements("postgres"))
    assert f"WHERE {status_in(sources('leased'))};" in first  # the queue
    assert first.count(f"WHERE {status_in(HELD)};") == 2  # held tasks by deadline, by worker


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_a_move_the_table_does_not_list_changes_nothing(store, status):
    t = submit(store)
    with store._tx() as db:
        db.execute("UPDATE tasks SET status = ? WHERE id = ?", (status, t.id))
        assert one(db, release(t.id, "queued", None, 0.0)) is None
        assert one(db, end_cancelled(t.id, "late", 0.0)) is None
    assert store.tasks.get(t.id).status == status


def test_the_lease_check_admits_only_the_holder_its_token_and_an_unexpired_held_lease():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE tasks (id TEXT, worker_id TEXT, status TEXT, lease_deadline REAL, lease_token TEXT)")
    db.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?, ?)", [
        ("current", "w1", "processing", 10.0, "tok"), ("at-deadline", "w1", "leased", 5.0, "tok"),
        ("expired", "w1", "leased", 4.9, "tok"), ("other-worker", "w2", "leased", 10.0, "tok"),
        ("other-token", "w1", "leased", 10.0, "old"), ("ended", "w1", "succeeded", 10.0, "tok"),
        ("queued", "w1", "queued", None, None)])
    held, args = lease_held("w1", 5.0, "tok")
    assert {r for (r,) in db.execute(f"SELECT id FROM tasks WHERE {held}", args)} == {"current", "at-deadline"}
    held, args = lease_held("w1", 5.0)  # a heartbeat's renewal: no token
    assert {r for (r,) in db.execute(f"SELECT id FROM tasks WHERE {held}", args)} == {
        "current", "at-deadline", "other-token"}
