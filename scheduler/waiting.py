"""Long polls, without a database connection or a thread per waiter: each waits on a future of the
event loop. Clients wait for tasks to end (TaskWatch: `Prefer: wait=N` on submit,
`GET /v1/tasks/{id}?wait_s=N`); workers' lease requests wait for work (Waiters).

A task that ends in this process (a report, a cancel) wakes its clients at once. One that ends in
another scheduler process, or by a lease sweep, is found by a single query every `poll_s` for all the
ids waited on here, so a thousand waiting clients cost one read a second, not a thousand.

When the process stops (`stop()`), every wait ends at once and later ones do not wait: clients get
the task as it stands and lease requests what is there now, so the stop need not outwait them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from protocol import FINAL_STATUSES, TaskView
from scheduler.store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")


class Stop:
    """The process is stopping (scheduler/server.py fires it on the loop, at the first stop signal):
    what listens (the app's waits) is told once."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []
        self.fired = False

    def listen(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)
        if self.fired:
            fn()

    def fire(self) -> None:
        self.fired = True
        for fn in self._listeners:
            fn()


class TaskWatch:
    def __init__(self, store: Store, poll_s: float = 1.0) -> None:
        self._store = store
        self._poll_s = poll_s
        self._waiting: dict[str, set[asyncio.Future]] = {}
        self._poller: asyncio.Task | None = None
        self._stopping = False

    @property
    def waiting(self) -> int:
        return sum(len(f) for f in self._waiting.values())

    async def wait(self, task_id: str, timeout_s: float) -> bool:
        """Until the task ends (True) or `timeout_s` passes or the process stops (False). The caller
        reads the task after."""
        if self._stopping:
            return False
        fut = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(task_id, set()).add(fut)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            done, _ = await asyncio.wait({fut}, timeout=timeout_s)
            return bool(done) and not self._stopping
        finally:
            waiters = self._waiting.get(task_id, set())
            waiters.discard(fut)
            if not waiters:
                self._waiting.pop(task_id, None)

    async def until_ended(self, task: TaskView, wait_s: float) -> TaskView:
        """The task once it has ended, or as it stands after `wait_s`. No connection is held meanwhile."""
        if wait_s <= 0 or task.status in FINAL_STATUSES:
            return task
        await self.wait(task.id, wait_s)
        return await self._store.acall(self._store.tasks.get, task.id)

    def ended(self, task_ids: Iterable[str]) -> None:
        """These tasks reached a final state: their waiters return."""
        for task_id in task_ids:
            for fut in self._waiting.get(task_id, ()):
                if not fut.done():
                    fut.set_result(None)

    def stop(self) -> None:
        """The process is stopping: every wait returns now, and none waits from here on."""
        self._stopping = True
        for futs in self._waiting.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(self._poll_s)
            ids = list(self._waiting)
            if not ids:
                break
            try:
                self.ended(await self._store.acall(self._store.tasks.ended_among, ids))
            except Exception:  # the database away: waiters time out or the next poll finds them
                log.exception("polling %d waited task(s) failed", len(ids))


class Waiters:
    """Long-polling lease requests, in arrival order. Work that appears wakes at most as many of
    them as it can serve (no thundering herd); each also looks again every `poll_s`, in case a
    wake-up from another scheduler process was missed.

    Each look enlists a future (True: a wake-up; False: its time is up). One that leaves unwoken is
    cancelled where it stands, not searched for in the line (hundreds long under a fleet's load,
    and most looks find work at once); wake-ups skip the cancelled, and the line is swept of them
    once they outnumber the requests in it."""

    def __init__(self, poll_s: float) -> None:
        self._queue: deque[asyncio.Future] = deque()
        self._poll_s = poll_s
        self._stopping = False
        self._enlisted = 0  # futures enlisted and not yet left

    async def poll(self, claim: Callable[[], Awaitable[list[T]]], wait_s: float,
                   gone: Callable[[], Awaitable[bool]] | None = None) -> list[T]:
        """What `claim` finds: at once, or after a wake-up or a look within `wait_s`; empty if nothing.
        Once `gone()` says the requester has left, nothing more is claimed for it, and a wake-up it
        got goes to the next waiter."""
        end = time.monotonic() + wait_s
        while True:
            woken = self.enlist()  # before the claim, so work added meanwhile is not missed
            got: list[T] = []
            left_us = False
            try:
                got = await claim()
                left = end - time.monotonic()
                if got or left <= 0 or self._stopping:
                    return got
                timer = asyncio.get_running_loop().call_later(min(left, self._poll_s), _time_up, woken)
                try:
                    await woken
                finally:
                    timer.cancel()
                if gone is not None and (left_us := await gone()):
                    return got
            finally:
                self.leave(woken, served=bool(got) or left_us)

    def enlist(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        self._enlisted += 1
        return fut

    def leave(self, fut: asyncio.Future, served: bool) -> None:
        """Done waiting. A wake-up that came while this request found work anyway goes to the next."""
        self._enlisted -= 1
        if not fut.done():
            fut.cancel()  # in the line still: skipped by wake-ups, swept out below
        elif served and not fut.cancelled() and fut.result():
            self.notify(1)
        if len(self._queue) > 2 * self._enlisted + 64:  # ended futures (cancelled, timed out) in the line
            self._queue = deque(f for f in self._queue if not f.done())

    def stop(self) -> None:
        """The process is stopping: every waiting request looks once more and returns, and later ones
        return after their first look."""
        self._stopping = True
        self.notify(len(self._queue))

    def notify_later(self, delay_s: float, n: int) -> None:
        """`notify(n)` after `delay_s`: for tasks no waiter may take before then (a set of adapters
        left to the worker holding it), so that a waiting worker looks when it may, not at its next
        poll (lease_poll_s) or the next task's wake-up. Nothing if nobody waits by then."""
        asyncio.get_running_loop().call_later(delay_s, self.notify, n)

    def notify(self, n: int) -> None:
        while n > 0 and self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(True)
                n -= 1


def _time_up(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
