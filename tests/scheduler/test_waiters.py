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


def test_a_stop_answers_every_long_poll_after_one_more_look_and_later_ones_do_not_wait():
    from scheduler.waiting import Stop, TaskWatch

    async def scenario():
        waiters, watch, stop = Waiters(poll_s=60.0), TaskWatch(store=None, poll_s=60.0), Stop()
        stop.listen(waiters.stop)
        stop.listen(watch.stop)
        looks = []

        async def claim():
            looks.append(1)
            return []

        polls = [asyncio.create_task(waiters.poll(claim, wait_s=60.0)) for _ in range(3)]
        waits = [asyncio.create_task(watch.wait("t1", 60.0)) for _ in range(2)]
        while len(looks) < 3 or watch.waiting < 2:
            await asyncio.sleep(0)
        stop.fire()
        done, pending = await asyncio.wait(polls + waits, timeout=5.0)
        assert not pending
        assert [p.result() for p in polls] == [[], [], []] and len(looks) == 6  # one more look each
        assert [w.result() for w in waits] == [False, False]  # answered as it stands, not "ended"
        assert await asyncio.wait_for(waiters.poll(claim, wait_s=60.0), 1.0) == []
        assert await asyncio.wait_for(watch.wait("t2", 60.0), 1.0) is False

    asyncio.run(scenario())


def test_looks_that_leave_unwoken_are_skipped_by_wake_ups_and_swept_from_the_line():
    async def scenario():
        waiters = Waiters(poll_s=5.0)
        waiting = waiters.enlist()
        for _ in range(10_000):  # claims that found work at once: each look enlisted, then left
            waiters.leave(waiters.enlist(), served=True)
        assert len(waiters._queue) <= 2 + 64
        last = waiters.enlist()
        waiters.notify(2)  # the two still waiting wake, whatever left between them
        assert waiting.result() is True and last.result() is True

    asyncio.run(scenario())


def test_a_look_whose_time_is_up_passes_no_wake_up_on():
    async def scenario():
        waiters = Waiters(poll_s=0.01)
        looks = []
        second = None

        async def claim():
            nonlocal second
            looks.append(1)
            if len(looks) == 2:  # the look after the time was up finds work
                second = waiters.enlist()
                return ["task"]
            return []

        assert await waiters.poll(claim, wait_s=5.0) == ["task"]
        assert not second.done()  # nobody was woken, so nothing is passed on

    asyncio.run(scenario())
