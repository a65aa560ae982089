"""Nothing on the event loop waits for what only the loop can release (docs/architecture.md, "Threads,
locks and the event loop").

The shape that hung a fresh SQLite scheduler as a fleet came up: a write on the loop opens the
loop's group transaction, which holds the write lock until its COMMIT at a later turn; the loop
thread's first read, in the same turn (a submit's admission check, a readiness probe), made its read
connection under that same lock and waited for itself, for ever. Here every read a request or the
upkeep makes on the loop runs as the loop's first read, in the turn a group opened, on a fresh
store of each backend. Each scenario runs on a thread of its own with a deadline, so a hang fails
the test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from protocol import RegisterWorker, SubmitTask
from scheduler.store import SQLiteStore, Unknown
from tests.scheduler.conftest import STORE_BACKENDS

DEADLINE_S = 10.0
REG = RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v")

# Reads the app makes through acall, each as it is called (the store, then its arguments).
READS = {
    "fleet_limits": lambda s: (s.workers.fleet_limits,),
    "ping": lambda s: (s.ping,),
    "get": lambda s: (s.tasks.get, "t-none"),
    "ended_among": lambda s: (s.tasks.ended_among, ["t-none"]),
    "queued_by_priority": lambda s: (s.tasks.queued_by_priority,),
    "figures": lambda s: (s.tasks.figures,),
    "workers": lambda s: (s.workers.workers,),
}
# Writes that open the loop's group: a registration (the fleet coming up) and a submit.
WRITES = {
    "register": lambda s: s.acall(s.workers.register, REG),
    "submit": lambda s: s.tasks.asubmit(SubmitTask(input={"prompt": "a lighthouse"})),
}


@pytest.fixture(params=STORE_BACKENDS)
def make_store(request, tmp_path):
    """A fresh store per call, closed after the test only if its scenario finished: closing one whose
    loop hangs would wait for the hung group's lock too."""
    made = []

    def make():
        if request.param == "sqlite":
            store = SQLiteStore(tmp_path / f"s{len(made)}.db")
        else:
            from scheduler.store.postgres import PostgresStore

            store = PostgresStore(request.getfixturevalue("postgres").fresh(), pool_size=4)
        made.append(store)
        return store

    yield make
    for store in made:
        if not getattr(store, "hung", False):
            store.close()


def finishes(scenario, store) -> bool:
    """Runs `scenario(store)` on a loop the store opened, on a thread; False if it is still running
    at the deadline (the thread is left behind: it can never finish)."""
    errors: list[BaseException] = []

    async def run():
        await store.aopen()
        try:
            await scenario(store)
        finally:
            await store.aclose()

    def target():
        try:
            asyncio.run(run())
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True, name="loop-under-test")
    thread.start()
    thread.join(DEADLINE_S)
    store.hung = thread.is_alive()
    if errors:
        raise errors[0]
    return not store.hung


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("read", sorted(READS))
def test_the_loops_first_read_in_the_turn_a_group_opened_does_not_wait_for_it(make_store, read, write):
    store = make_store()

    async def scenario(s):
        fn, *args = READS[read](s)
        # Both calls start in the same turn: the write opens the group (its COMMIT comes at a later
        # turn), then the read runs while that group is open.
        wrote = asyncio.ensure_future(WRITES[write](s))
        looked = asyncio.ensure_future(s.acall(fn, *args))
        results = await asyncio.gather(wrote, looked, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, Unknown):
                raise r

    assert finishes(scenario, store), f"the loop waited for itself: {read} while a {write}'s group was open"


def test_reads_and_writes_of_many_turns_interleaved_all_finish(make_store):
    """Registrations, submits and the admission read, many to a turn and across turns, as a fleet
    coming up makes them: every call is answered."""
    store = make_store()

    async def scenario(s):
        calls = []
        for i in range(50):
            calls.append(s.acall(s.workers.register, REG))
            calls.append(s.tasks.asubmit(SubmitTask(input={"prompt": f"p{i}"})))
            calls.append(s.acall(s.workers.fleet_limits))
            if i % 7 == 0:
                calls.append(asyncio.to_thread(s.tasks.queued_by_priority))  # a thread's read, as QueueLoad's
                await asyncio.sleep(0)
        await asyncio.gather(*calls)
        assert s.tasks.queued_count() == 50

    assert finishes(scenario, store)
