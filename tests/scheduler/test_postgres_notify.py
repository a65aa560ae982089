"""Scheduler processes on one PostgreSQL database tell each other of new work: a task submitted
through one wakes the long polls of another (NOTIFY, here in the submit's own INSERT), a replay of an
idempotency key announces nothing, a process is not told of its own submissions, and the submits
made while a NOTIFY is on its way are announced together in the next."""

from __future__ import annotations

import asyncio
import contextlib
import queue

import pytest

from protocol import SubmitTask
from scheduler.store.postgres import PostgresStore
from scheduler.store.postgres_loop import Announcer
from tests.scheduler.pg_store import on_loop


@pytest.fixture
def pair(postgres):
    url = postgres.fresh()
    a, b = PostgresStore(url, pool_size=2), PostgresStore(url, pool_size=2)
    heard = {"a": queue.Queue(), "b": queue.Queue()}
    a.listen(heard["a"].put)
    b.listen(heard["b"].put)
    try:
        yield a, b, heard
    finally:
        a.close()
        b.close()


def until_listening(a, heard) -> None:
    """LISTEN runs on its own thread: submit until the other process hears one (bounded)."""
    for _ in range(100):
        a.tasks.submit(SubmitTask(input={"prompt": "warm-up"}))
        try:
            heard.get(timeout=0.1)
            break
        except queue.Empty:
            continue
    else:
        raise AssertionError("the other process never heard a submission")
    while True:  # a warm-up heard late: drained until half a second passes without one
        try:
            heard.get(timeout=0.5)
        except queue.Empty:
            return


def test_a_submit_in_one_process_is_heard_by_the_other_and_not_by_itself(pair):
    a, b, heard = pair
    until_listening(a, heard["b"])

    _, created = on_loop(a, lambda: a.tasks.asubmit(SubmitTask(input={"prompt": "on the loop"}, idempotency_key="k")))
    assert created and heard["b"].get(timeout=10) == 1
    a.tasks.submit_many([SubmitTask(input={"prompt": f"batch {i}"}) for i in range(3)])
    assert heard["b"].get(timeout=10) == 3
    _, created = a.tasks.submit(SubmitTask(input={"prompt": "on the loop"}, idempotency_key="k"))  # a replay
    assert not created
    b.tasks.submit_many([SubmitTask(input={"prompt": f"from b {i}"}) for i in range(5)])
    # Notifications arrive in commit order: the first each hears is the other's latest, so neither
    # heard itself (a's 1s and 3, b's 5) and the replay announced nothing.
    assert heard["a"].get(timeout=10) == 5
    a.tasks.submit_many([SubmitTask(input={"prompt": f"marker {i}"}) for i in range(2)])
    assert heard["b"].get(timeout=10) == 2


def test_submits_made_while_a_notify_is_on_its_way_go_out_together_in_the_next():
    sent, first_in_flight, release = [], None, None

    class Conn:
        async def execute(self, sql, args):
            sent.append(args[1])
            if len(sent) == 1:
                first_in_flight.set()
                await release.wait()

    class Pool:
        @contextlib.asynccontextmanager
        async def connection(self):
            yield Conn()

    async def scenario():
        nonlocal first_in_flight, release
        first_in_flight, release = asyncio.Event(), asyncio.Event()
        announcer = Announcer(Pool(), "me")
        announcer.add(1)
        await first_in_flight.wait()
        for n in (2, 3, 4):
            announcer.add(n)
        release.set()
        await announcer.flushed()

    asyncio.run(scenario())
    assert sent == ["me:1", "me:9"]


def test_many_submits_at_once_are_all_announced(pair):
    a, b, heard = pair
    until_listening(a, heard["b"])

    made = on_loop(a, lambda: asyncio.gather(*[a.tasks.asubmit(SubmitTask(input={"prompt": f"b{i}"}))
                                               for i in range(40)]))
    assert all(created for _, created in made)
    total = 0
    while total < 40:
        total += heard["b"].get(timeout=10)
    assert total == 40
