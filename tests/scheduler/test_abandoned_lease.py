"""A long poll whose worker has gone (its client timed out, the node restarted) takes no task: the
task stays queued for a worker that is listening, its attempt uncounted."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from protocol import RegisterWorker, SubmitTask
from scheduler.api.workers import give_back
from scheduler.waiting import Waiters
from tests.harness import drain, register


def test_a_long_poll_whose_worker_has_gone_claims_nothing(server):
    gone, listening = register(server), register(server)
    drain(server, gone)
    with pytest.raises(httpx.ReadTimeout):  # the worker stops waiting; its connection closes
        server.post(f"/v1/workers/{gone}/lease", json={"max_tasks": 1, "wait_s": 3}, timeout=0.5)
    t = server.post("/v1/tasks", json={"input": {"prompt": "nobody is listening"}}).json()
    # The abandoned poll was first in line for the wake-up. Had it claimed, the task would be held
    # until its lease expired (1 s here) and come back as attempt 2.
    got = server.post(f"/v1/workers/{listening}/lease", json={"max_tasks": 1, "wait_s": 2}).json()["leases"]
    assert [(le["task_id"], le["attempt"]) for le in got] == [(t["id"], 1)]


def test_a_wake_up_for_a_poll_whose_worker_has_gone_goes_to_the_next_waiter():
    async def scenario():
        waiters = Waiters(poll_s=5.0)
        claims = []

        async def claim():
            claims.append(1)
            return []

        async def left():
            return True

        abandoned = asyncio.create_task(waiters.poll(claim, 5.0, left))
        await asyncio.sleep(0)  # it claims once (nothing yet) and waits
        nxt = waiters.enlist()
        waiters.notify(1)
        assert await asyncio.wait_for(abandoned, 1) == [] and claims == [1]  # woken: no second claim
        assert nxt.done()  # the wake-up passed on

    asyncio.run(scenario())


def test_leases_claimed_for_a_worker_that_has_gone_go_back_uncounted(make_store):
    store = make_store(lease_ttl_s=10.0, max_attempts=2)
    wid = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))[0]
    task, _ = store.tasks.submit(SubmitTask(input={"prompt": "p"}))
    got = store.claims.claim(wid, 1)
    asyncio.run(give_back(wid, got, store.reports))
    back = store.tasks.get(task.id)
    assert (back.status, back.attempts) == ("queued", 0)
    assert [le.attempt for le in store.claims.claim(wid, 1)] == [1]
