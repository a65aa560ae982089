"""Submits, report rounds and claims on PostgreSQL are group-committed: the writes that arrive
together on the event loop go in one transaction (scheduler/store/postgres_loop.py, GroupCommit), each
call answered as it would be alone: a submit its own task, or the first task of an idempotency key
already used; a report its task, or its own refusal; a claim its own tasks, none leased twice."""

from __future__ import annotations

import asyncio

import pytest

from protocol import RegisterWorker, Report, SubmitTask
from scheduler.store import Refused
from scheduler.store.postgres_loop import GroupCommit
from tests.scheduler.pg_store import fresh_store, on_loop


@pytest.fixture
def store(postgres):
    yield from fresh_store(postgres)


def test_submits_arriving_together_are_stored_in_one_batch_each_answered_alone(store):
    reqs = [SubmitTask(input={"prompt": f"together {i}"}) for i in range(40)]

    async def submit_all():
        return await asyncio.gather(*[store.tasks.asubmit(r) for r in reqs])

    out = on_loop(store, submit_all)
    assert store._hot.intake.batches == 1  # all 40 were waiting when the sender took its batch
    assert all(created for _, created in out)
    assert [view.input["prompt"] for view, _ in out] == [r.input["prompt"] for r in reqs]
    assert len({view.id for view, _ in out}) == 40
    stored = {t.id: t.status for t in store.tasks.list(None, 100, 0)}
    assert stored == {view.id: "queued" for view, _ in out}


def test_one_idempotency_key_twice_in_a_batch_makes_one_task(store):
    same = SubmitTask(input={"prompt": "once"}, idempotency_key="k-1")
    other = SubmitTask(input={"prompt": "another"})

    async def submit_all():
        return await asyncio.gather(store.tasks.asubmit(same), store.tasks.asubmit(other),
                                    store.tasks.asubmit(same.model_copy()))

    (first, made_first), (_, made_other), (again, made_again) = on_loop(store, submit_all)
    assert store._hot.intake.batches == 1
    assert made_first and made_other and not made_again
    assert again.id == first.id
    assert len(store.tasks.list(None, 100, 0)) == 2


def test_submits_beyond_a_batch_go_in_the_next_ones(store, monkeypatch):
    monkeypatch.setattr(GroupCommit, "MAX_BATCH", 8)
    reqs = [SubmitTask(input={"prompt": f"many {i}"}) for i in range(30)]

    async def submit_all():
        return await asyncio.gather(*[store.tasks.asubmit(r) for r in reqs])

    out = on_loop(store, submit_all)
    assert all(created for _, created in out)
    assert store._hot.intake.batches == 4  # 8 + 8 + 8 + 6
    assert len(store.tasks.list(None, 100, 0)) == 30


def test_single_reports_arriving_together_are_applied_in_one_batch_a_stale_one_refused_alone(store):
    wid = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))[0]
    for i in range(6):
        store.tasks.submit(SubmitTask(input={"prompt": f"held {i}"}))
    leases = store.claims.claim(wid, 6)
    reports = [(le.task_id, Report(worker_id=wid, lease_token=le.lease_token, status="processing")) for le in leases]
    reports[2] = (reports[2][0], Report(worker_id=wid, lease_token="not-its-token", status="processing"))

    async def report_all():
        return await asyncio.gather(*[store.reports.areport(t, r) for t, r in reports], return_exceptions=True)

    out = on_loop(store, report_all)
    assert store._hot.reports.batches == 1
    assert isinstance(out[2], Refused)
    assert [v.status for i, v in enumerate(out) if i != 2] == ["processing"] * 5
    assert store.tasks.get(reports[2][0]).status == "leased"


def test_claims_arriving_together_are_committed_in_one_batch_and_never_share_a_task(store):
    reg = RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v")
    workers = [store.workers.register(reg)[0] for _ in range(5)]
    for i in range(8):
        store.tasks.submit(SubmitTask(input={"prompt": f"queued {i}"}))

    async def claim_all():
        return await asyncio.gather(*[store.claims.aclaim(w, 2) for w in workers])

    got = on_loop(store, claim_all)
    assert store._hot.claims.batches == 1
    ids = [lease.task_id for leases in got for lease in leases]
    assert len(ids) == 8 and len(set(ids)) == 8  # 2 + 2 + 2 + 2 + 0: each task leased once
    assert sorted(len(leases) for leases in got) == [0, 2, 2, 2, 2]
    assert {store.tasks.get(t).status for t in ids} == {"leased"}


def test_closing_waits_for_a_batch_whose_callers_have_gone(store):
    async def run():
        await store.aopen()
        submits = [asyncio.ensure_future(store.tasks.asubmit(SubmitTask(input={"prompt": f"left {i}"})))
                   for i in range(5)]
        await asyncio.sleep(0)  # each submit's INSERT waits for the batch; the batch is about to be sent
        for s in submits:
            s.cancel()
        await store.aclose()  # the batch is still written before the pool closes
        return submits

    asyncio.run(run())
    assert store._hot.intake.batches == 1
    assert sorted(t.input["prompt"] for t in store.tasks.list(None, 10, 0)) == [f"left {i}" for i in range(5)]


def test_exchanges_arriving_together_go_on_the_loop_their_results_group_committed(store):
    # An exchange's reports (a task's note with its result, another's note) and its cancel read
    # run on the event loop, not on a thread; the results of exchanges arriving together share one
    # batch, and a cancelled task's note is refused as it would be alone.
    wid = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))[0]
    for i in range(6):
        store.tasks.submit(SubmitTask(input={"prompt": f"exchanged {i}"}))
    leases = store.claims.claim(wid, 6)
    store.reports.cancel(leases[5].task_id)
    result = {"uri": "u", "content_type": "image/png", "width": 1, "height": 1, "seed": 1, "bytes": 1, "sha256": "s"}

    def mine(le, status, **kw):
        return le.task_id, Report(worker_id=wid, lease_token=le.lease_token, status=status, **kw)

    calls = [[mine(le, "processing", at=0.0), mine(le, "succeeded", result=result), mine(nxt, "processing")]
             for le, nxt in ((leases[0], leases[3]), (leases[1], leases[4]), (leases[2], leases[5]))]

    async def exchange_all():
        threads = asyncio.to_thread  # nothing of an exchange may go there
        asyncio.to_thread = None
        try:
            return await asyncio.gather(*[store.reports.areport_many(c, views=False) for c in calls],
                                        store.claims.acancelled_among(wid, [le.task_id for le in leases]))
        finally:
            asyncio.to_thread = threads

    *outs, cancelled = on_loop(store, exchange_all)
    assert cancelled == [leases[5].task_id]
    assert [[o.status if not isinstance(o, Exception) else type(o).__name__ for o in out] for out in outs] == [
        ["processing", "succeeded", "processing"]] * 2 + [["processing", "succeeded", "Cancelled"]]
    assert store._hot.reports.batches == 1
    assert [store.tasks.get(le.task_id).status for le in leases] == ["succeeded"] * 3 + ["processing"] * 2 + [
        "cancelled"]
