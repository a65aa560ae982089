"""Scheduler processes on one PostgreSQL database tell each other of new work: a task submitted
through one wakes the long polls of another (NOTIFY, here in the submit's own INSERT), a replay of an
idempotency key announces nothing, and a process is not told of its own submissions."""

from __future__ import annotations

import asyncio
import queue

import pytest

from protocol import SubmitTask
from scheduler.store.postgres import PostgresStore


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

    async def from_the_loop():
        await a.aopen()
        try:
            return await a.tasks.asubmit(SubmitTask(input={"prompt": "on the loop"}, idempotency_key="k"))
        finally:
            await a.aclose()

    _, created = asyncio.run(from_the_loop())
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
