"""The lifecycles as data (scheduler/store/lifecycle.py): TRANSITIONS covers the protocol's task
statuses, its final ones are the protocol's, the guards built from it are the partial indexes' own
conditions and stop a move it does not list, and the one lease check admits only the current lease;
REGISTRATION_TRANSITIONS covers every registration status, and the store's registration statements
make no move it does not list."""

from __future__ import annotations

import sqlite3
from typing import get_args

import pytest

from protocol import FINAL_STATUSES, Heartbeat, RegistrationStatus, TaskStatus, WorkerStatus
from scheduler.store import Unknown, migrate
from scheduler.store.lifecycle import (
    CLOSED,
    HELD,
    REGISTRATION_TRANSITIONS,
    TAKING,
    TRANSITIONS,
    end_cancelled,
    lease_held,
    registration_sources,
    release,
    sources,
    status_in,
)
from scheduler.store.plans import one
from tests.scheduler.test_store import submit, worker

R = RegistrationStatus


@pytest.fixture
def store(make_store):
    return make_store(lease_ttl_s=10.0, max_attempts=2)


def test_every_status_is_listed_and_the_final_ones_are_the_protocols():
    assert set(TRANSITIONS) == set(get_args(TaskStatus))
    assert all(set(nxt) <= set(TRANSITIONS) and status not in nxt for status, nxt in TRANSITIONS.items())
    assert FINAL_STATUSES == tuple(status for status, nxt in TRANSITIONS.items() if not nxt)  # one set
    assert HELD == ("leased", "processing") and sources("leased") == ("queued",)


def test_the_guards_are_the_partial_indexes_conditions():
    """Written alike, so the planners of both databases use those indexes for the guarded statements."""
    first = "\n".join(migrate.migrations()[0].statements("postgres"))
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


# ---------------------------------------------------------------- a worker registration

def test_every_registration_status_is_listed_and_a_worker_reports_only_its_own():
    assert list(REGISTRATION_TRANSITIONS) == list(R)
    assert all(status not in nxt for status, nxt in REGISTRATION_TRANSITIONS.items())
    assert set(get_args(WorkerStatus)) == {R.INITIALIZING, R.READY, R.DRAINING, R.DRAINED}
    assert REGISTRATION_TRANSITIONS[R.REPLACED] == ()  # final: its group is gone
    assert registration_sources(R.REPLACED) == tuple(s for s in R if s != R.REPLACED)  # any, once its node is back
    assert CLOSED == (R.DRAINED, R.REPLACED, R.LOST) and TAKING == (R.INITIALIZING, R.READY)


def status_of(store, worker_id: str) -> str:
    return store._read().execute("SELECT status FROM workers WHERE id = ?", (worker_id,)).fetchone()["status"]


@pytest.mark.parametrize("was", list(R))
@pytest.mark.parametrize("says", [R.INITIALIZING, R.READY, R.DRAINING, R.DRAINED])
def test_a_heartbeat_moves_a_registration_only_where_the_table_allows(store, was, says):
    w = worker(store)
    with store._tx() as db:
        db.execute("UPDATE workers SET status = ? WHERE id = ?", (was.value, w))
    try:
        store.workers.heartbeat(w, Heartbeat(status=says, timestamp=0))
    except Unknown:
        assert was == R.DRAINED  # it left: refused, and unchanged
    allowed = says in REGISTRATION_TRANSITIONS[was]
    assert status_of(store, w) == (says if allowed else was)


@pytest.mark.parametrize("was", list(R))
def test_a_node_registering_again_replaces_its_registration_only_where_the_table_allows(store, was):
    w = worker(store, node_id="n1")
    with store._tx() as db:
        db.execute("UPDATE workers SET status = ? WHERE id = ?", (was.value, w))
    fresh = worker(store, node_id="n1")
    assert status_of(store, fresh) == R.INITIALIZING
    assert status_of(store, w) == (R.REPLACED if R.REPLACED in REGISTRATION_TRANSITIONS[was] else was)


@pytest.mark.parametrize("was", list(R))
def test_silence_makes_a_registration_lost_only_where_the_table_allows(make_store, clock, was):
    store = make_store(liveness_s=5.0)
    w = worker(store)
    with store._tx() as db:
        db.execute("UPDATE workers SET status = ? WHERE id = ?", (was.value, w))
    clock.now += 6
    store.upkeep.sweep()
    assert status_of(store, w) == (R.LOST if R.LOST in REGISTRATION_TRANSITIONS[was] else was)
