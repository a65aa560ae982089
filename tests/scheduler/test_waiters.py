"""Long-polling lease requests are woken at most as many as the new work can serve."""

from __future__ import annotations

import asyncio

from scheduler.waiting import Waiters


def test_one_new_task_wakes_one_waiter_in_arrival_order():
    async def scenario():
        waiters = Waiters(poll_s=5.0)
        futs = [waiters.enlist() for _ in range(5)]
        waiters.notify(1)
        assert [f.done() for f in futs] == [True, False, False, False, False]
        waiters.notify(3)
        assert sum(f.done() for f in futs) == 4
        waiters.notify(10)  # more work than waiters: everyone wakes, nothing is kept for later
        assert all(f.done() for f in futs)
        late = waiters.enlist()
        assert not late.done()

    asyncio.run(scenario())


def test_a_wakeup_that_came_while_the_request_found_work_anyway_goes_to_the_next():
    async def scenario():
        waiters = Waiters(poll_s=5.0)
        first, second = waiters.enlist(), waiters.enlist()
        waiters.notify(1)  # meant for `first`, which got a task from its own claim
        waiters.leave(first, served=True)
        assert second.done()
        third = waiters.enlist()
        waiters.leave(second, served=False)  # woken, found nothing: the wake is not passed on
        assert not third.done()

    asyncio.run(scenario())
