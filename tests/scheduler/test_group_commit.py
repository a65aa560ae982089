"""SQLite's group commit: the calls the event loop makes within one turn share a transaction and one
fsync; each is atomic on its own, and none returns before the COMMIT that makes it durable."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from protocol import Heartbeat, RegisterWorker, SubmitTask
from scheduler.store import Refused, SQLiteStore, Unknown
from tests.scheduler.commits import OnCommit


def on_loop(store: SQLiteStore, scenario) -> None:
    """`scenario()` on an event loop that the store groups the calls of, as the app's lifespan does."""
    async def run():
        await store.aopen()
        await scenario()
        await store.aclose()

    asyncio.run(run())


def committed(path) -> int:
    """Tasks another connection sees: what is on disk."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]


def test_calls_made_together_share_one_commit_and_are_on_disk_when_they_return(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(path)

    async def scenario():

        async def submit(i: int) -> int:
            await store.acall(store.tasks.submit, SubmitTask(input={"prompt": f"{i}"}))
            return committed(path)  # the moment it returns, before anything else runs

        seen = await asyncio.gather(*[submit(i) for i in range(20)])
        assert all(n == 20 for n in seen)  # each returned after the one COMMIT of all twenty
        assert store.group_commits == 1

    on_loop(store, scenario)
    store.close()


def test_a_call_that_fails_undoes_only_itself(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(path)

    async def scenario():
        first = SubmitTask(input={"prompt": "a"}, idempotency_key="k")
        await store.acall(store.tasks.submit, first)
        other = SubmitTask(input={"prompt": "other"}, idempotency_key="k")  # the key with another body
        out = await asyncio.gather(store.acall(store.tasks.submit_many, [SubmitTask(input={"prompt": "b"}), other]),
                                   store.acall(store.tasks.submit, SubmitTask(input={"prompt": "c"})),
                                   return_exceptions=True)
        assert isinstance(out[0], Refused) and not isinstance(out[1], Exception)

    on_loop(store, scenario)
    store.close()
    with sqlite3.connect(path) as db:  # the refused batch left nothing, not even its first task
        assert sorted(r[0] for r in db.execute("SELECT input FROM tasks")) == ['{"prompt": "a"}', '{"prompt": "c"}']


def test_reads_in_a_plan_see_the_groups_earlier_writes(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")

    async def scenario():
        reg = RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v")
        wid, _ = await store.acall(store.workers.register, reg)
        # In one turn: the worker says it drained, then a lease of its finds the queue empty and reads
        # its registration. Read from the last commit, it would still look ready and get an empty lease.
        drained = store.acall(store.workers.heartbeat, wid, Heartbeat(status="drained", timestamp=0))
        out = await asyncio.gather(drained, store.claims.aclaim(wid, 1), return_exceptions=True)
        assert isinstance(out[1], Unknown) and "drained" in str(out[1])

    on_loop(store, scenario)
    store.close()


def test_threads_calls_commit_on_their_own_while_the_loop_groups(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(path)

    async def scenario():
        await asyncio.gather(store.acall(store.tasks.submit, SubmitTask(input={"prompt": "loop"})),
                             asyncio.to_thread(store.tasks.submit, SubmitTask(input={"prompt": "thread"})))

    on_loop(store, scenario)
    assert committed(path) == 2 and store.group_commits == 1  # the thread's call was its own transaction
    store.close()


def test_the_loop_runs_on_while_a_commit_is_in_flight_and_later_calls_form_the_next_group(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    real = store._db
    started, go = threading.Event(), threading.Event()
    store._db = store._group._db = OnCommit(real, lambda: (started.set(), go.wait(10)))  # each COMMIT waits for the test

    async def scenario():
        first = asyncio.create_task(store.acall(store.tasks.submit, SubmitTask(input={"prompt": "first"})))
        assert await asyncio.to_thread(started.wait, 10)  # its COMMIT is on the committer thread
        # Meanwhile the loop serves: another call is made, and waits for that COMMIT, not in it.
        second = asyncio.create_task(store.acall(store.tasks.submit, SubmitTask(input={"prompt": "second"})))
        await asyncio.sleep(0)
        assert not first.done() and not second.done() and committed(path) == 0
        go.set()
        await first
        await second
        assert committed(path) == 2 and store.group_commits == 2

    on_loop(store, scenario)
    store._db = store._group._db = real
    store.close()


def test_a_read_alone_waits_for_no_commit_in_flight_and_sees_the_last_one(tmp_path):
    """A worker's cancel notices (a read) are answered while the last group's COMMIT is still on the
    committer thread, from what is on disk: a cancel in that group is told at its next exchange."""
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    wid, _ = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))
    store.tasks.submit(SubmitTask(input={"prompt": "held"}))
    task_id = store.claims.claim(wid, 1)[0].task_id
    real = store._db
    started, go = threading.Event(), threading.Event()
    store._db = store._group._db = OnCommit(real, lambda: (started.set(), go.wait(10)))

    async def scenario():
        cancel = asyncio.create_task(store.acall(store.reports.cancel, task_id))
        assert await asyncio.to_thread(started.wait, 10)  # the cancel's COMMIT is held
        before = await asyncio.wait_for(store.claims.acancelled_among(wid, [task_id]), 5)
        go.set()
        await cancel
        return before, await store.claims.acancelled_among(wid, [task_id])

    out = []
    on_loop(store, lambda: _into(out, scenario()))
    store._db = store._group._db = real
    store.close()
    assert out == [([], [task_id])]


async def _into(out: list, coro) -> None:
    out.append(await coro)
