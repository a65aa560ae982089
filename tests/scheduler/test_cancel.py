"""Cancellation in the store (both backends, fake clock): queued ends at once, held tasks are marked
and end `cancelled` whatever their worker reports next, never `succeeded`, and never run again."""

from __future__ import annotations

import pytest

from protocol import Heartbeat, Report
from scheduler.store import Cancelled, Refused, Unknown
from tests.scheduler.test_store import fail, ok, submit, worker


@pytest.fixture
def store(make_store):
    return make_store(lease_ttl_s=10.0, max_attempts=3)


def test_a_queued_task_is_cancelled_at_once_and_never_leased(store):
    w = worker(store)
    t = submit(store)
    done = store.reports.cancel(t.id)
    assert done.status == "cancelled" and done.error.code == "cancelled" and done.finished_at is not None
    assert store.claims.claim(w, 5) == []
    with pytest.raises(Refused, match="already ended"):
        store.reports.cancel(t.id)
    assert store.tasks.get(t.id).updated_at == done.updated_at  # a second cancel changes nothing


def test_a_held_task_is_marked_its_worker_is_told_and_its_success_is_refused(store):
    w = worker(store)
    t = submit(store)
    (lease,) = store.claims.claim(w, 1)
    store.reports.report(t.id, Report(worker_id=w, lease_token=lease.lease_token, status="processing"))
    marked = store.reports.cancel(t.id)
    assert marked.status == "processing" and marked.cancel_requested_at is not None
    reply = store.workers.heartbeat(w, Heartbeat(status="ready", in_flight=[t.id], timestamp=0))
    assert reply.cancelled == [t.id] and t.id in reply.renewed  # still renewed: the worker will report it
    with pytest.raises(Cancelled):
        store.reports.report(t.id, ok(lease.lease_token, w))
    ended = store.tasks.get(t.id)
    assert ended.status == "cancelled" and ended.result is None
    with pytest.raises(Refused):  # and it stays cancelled
        store.reports.report(t.id, ok(lease.lease_token, w))


@pytest.mark.parametrize("status", ["processing", "failed", "released"])
def test_any_report_on_a_cancelled_task_ends_it_cancelled(store, status):
    w = worker(store)
    t = submit(store)
    (lease,) = store.claims.claim(w, 1)
    store.reports.cancel(t.id)
    report = fail(lease.lease_token, w, True) if status == "failed" else \
        Report(worker_id=w, lease_token=lease.lease_token, status=status)
    with pytest.raises(Cancelled):
        store.reports.report(t.id, report)
    assert store.tasks.get(t.id).status == "cancelled" and store.claims.claim(w, 1) == []


def test_a_round_of_reports_refuses_the_cancelled_one_and_applies_the_others(store):
    w = worker(store)
    a, b = submit(store, "a"), submit(store, "b")
    leases = {x.task_id: x for x in store.claims.claim(w, 2)}
    store.reports.cancel(b.id)
    out = store.reports.report_many([(t.id, ok(leases[t.id].lease_token, w)) for t in (a, b)])
    assert out[0].status == "succeeded" and isinstance(out[1], Cancelled)
    assert store.tasks.get(b.id).status == "cancelled"


def test_an_expired_lease_on_a_cancelled_task_ends_it_instead_of_requeueing(store, clock):
    w = worker(store)
    t = submit(store)
    store.claims.claim(w, 1)
    store.reports.cancel(t.id)
    clock.now += 11
    store.upkeep.sweep()
    assert store.tasks.get(t.id).status == "cancelled" and store.claims.claim(w, 1) == []


def test_cancelling_an_unknown_or_finished_task(store):
    w = worker(store)
    with pytest.raises(Unknown):
        store.reports.cancel("nope")
    t = submit(store)
    (lease,) = store.claims.claim(w, 1)
    store.reports.report(t.id, ok(lease.lease_token, w))
    before = store.tasks.get(t.id)
    with pytest.raises(Refused, match="already ended \\(succeeded\\)"):
        store.reports.cancel(t.id)
    assert store.tasks.get(t.id) == before
