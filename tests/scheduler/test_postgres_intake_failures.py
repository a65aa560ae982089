"""A group-committed batch of submits on PostgreSQL that fails: when one row's data is refused,
the batch is sent again one statement at a time, so that only that submit fails and the others are
stored; when the batch cannot be sent at all, every submit in it hears why; and a call whose plan
goes on after its batch, once the async pool is gone, goes on the blocking way."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from protocol import SubmitTask
from scheduler.store.plans import Write
from tests.scheduler.pg_store import fresh_store


@pytest.fixture
def store(postgres):
    yield from fresh_store(postgres)


def insert(store, prompt: str, task_id: str | None = None) -> Write:
    """A submit's INSERT as the store writes it; `task_id` in place of the fresh id it draws."""
    sql, args = store.tasks._insert(SubmitTask(input={"prompt": prompt}), store.clock(), announce=False)
    return Write(sql, (task_id or args[0], *args[1:]))


def test_a_row_refused_fails_its_submit_alone(store):
    taken, _ = store.tasks.submit(SubmitTask(input={"prompt": "first"}))
    steps = [insert(store, "a"), insert(store, "dup", task_id=taken.id), insert(store, "b")]

    async def run():
        await store.aopen()
        try:
            return await asyncio.gather(*[store._hot.intake.write(s) for s in steps], return_exceptions=True)
        finally:
            await store.aclose()

    a, dup, b = asyncio.run(run())
    assert isinstance(dup, psycopg.errors.UniqueViolation)
    assert a[0]["input"] == '{"prompt": "a"}' and b[0]["input"] == '{"prompt": "b"}'
    assert store._hot.intake.batches == 1  # sent together, refused, then one by one
    assert sorted(t.input["prompt"] for t in store.tasks.list(None, 10, 0)) == ["a", "b", "first"]


def test_a_batch_that_cannot_be_sent_fails_every_submit_in_it(store):
    async def run():
        await store.aopen()
        try:
            await store._hot.pool.close()  # the pool gone: no connection for the batch
            return await asyncio.gather(*[store.tasks.asubmit(SubmitTask(input={"prompt": f"lost {i}"}))
                                          for i in range(3)], return_exceptions=True)
        finally:
            await store.aclose()

    out = asyncio.run(run())
    assert len(out) == 3 and all(isinstance(e, Exception) for e in out)
    assert len({type(e) for e in out}) == 1
    assert store.tasks.list(None, 10, 0) == []


def test_a_plan_resumed_after_the_pool_closed_goes_on_the_blocking_way(store):
    """A call whose batch committed as the store closed: its plan's next step still runs."""
    taken, _ = store.tasks.submit(SubmitTask(input={"prompt": "first"}, idempotency_key="k"))
    plan = store.tasks._submit(SubmitTask(input={"prompt": "first"}, idempotency_key="k"), store.clock(),
                               announce=False)
    step = next(plan)  # its INSERT, which the key already taken leaves without a row
    plan_next = plan.send([])  # the read of the first task, not yet run
    view, created = asyncio.run(store._arun(plan, plan_next))  # no async pool: the blocking way
    assert not created and view.id == taken.id
    assert step.sql.startswith("INSERT")
