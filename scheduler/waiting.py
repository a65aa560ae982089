"""Clients waiting for tasks to end (`Prefer: wait=N` on submit, `GET /v1/tasks/{id}?wait_s=N`),
without a database connection or a thread per waiter: each waits on a future of the event loop.

A task that ends in this process (a report, a cancel) wakes its waiters at once. One that ends in
another scheduler process, or by a lease sweep, is found by a single query every `poll_s` for all the
ids waited on here, so a thousand waiting clients cost one read a second, not a thousand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from scheduler.store import Store

log = logging.getLogger(__name__)


class TaskWatch:
    def __init__(self, store: Store, poll_s: float = 1.0) -> None:
        self._store = store
        self._poll_s = poll_s
        self._waiting: dict[str, set[asyncio.Future]] = {}
        self._poller: asyncio.Task | None = None

    @property
    def waiting(self) -> int:
        return sum(len(f) for f in self._waiting.values())

    async def wait(self, task_id: str, timeout_s: float) -> bool:
        """Until the task ends (True) or `timeout_s` passes (False). The caller reads the task after."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(task_id, set()).add(fut)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            done, _ = await asyncio.wait({fut}, timeout=timeout_s)
            return bool(done)
        finally:
            waiters = self._waiting.get(task_id, set())
            waiters.discard(fut)
            if not waiters:
                self._waiting.pop(task_id, None)

    def ended(self, task_ids: Iterable[str]) -> None:
        """These tasks reached a final state: their waiters return."""
        for task_id in task_ids:
            for fut in self._waiting.get(task_id, ()):
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
