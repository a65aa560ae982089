"""The tasks handed to the post stage and not yet reported, in lease order. Post stages run in a
pool and may finish before an earlier task's; their final reports still go in the order the tasks
were leased, the ones finished together in one call. The serve loop waits here for room before each
round (its `settle` time) and for everything at the end."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait

from protocol import ErrorCode
from worker.serving.ledger import Ledger
from worker.serving.reporter import Reporter
from worker.serving.results import PostResult, failure
from worker.serving.task import Task

log = logging.getLogger(__name__)


class Backlog:
    def __init__(self, reporter: Reporter, ledger: Ledger) -> None:
        self._reporter = reporter
        self._ledger = ledger
        self._pending: deque[tuple[Task, Future]] = deque()

    def add(self, task: Task, post: Future) -> None:
        """A task handed to the post stage; reported once it and every earlier one are finished."""
        self._pending.append((task, post))

    def __len__(self) -> int:
        return len(self._pending)

    def report_down_to(self, limit: int, keepalive: Callable[[], None], every_s: float) -> None:
        """Reports finished post stages in lease order, and waits until at most `limit` tasks are
        unreported, calling `keepalive` (the followers wait in a collective) every `every_s` meanwhile."""
        while self._pending:
            task, post = self._pending[0]
            # Failed by the watchdog, or lost: not waited for. A cancelled one is: it reports `cancelled`.
            if self._ledger.dropped(task) and not post.done():
                self._pending.popleft()
                continue
            if not post.done():
                if len(self._pending) <= limit:
                    return
                if not wait([post], timeout=every_s).done:
                    keepalive()
                continue
            done = []
            while self._pending and self._pending[0][1].done():  # every finished one at the head
                task, post = self._pending.popleft()
                done.append((task, _result(task, post)))
            self._reporter.finals(done)


def _result(task: Task, post: Future) -> PostResult:
    try:
        return post.result()
    except Exception as e:  # a bug in the post stage: fail the task, keep serving
        log.exception("task %s: post-processing failed", task.id, extra=task.fields(stage="post"))
        return failure(ErrorCode.INTERNAL_ERROR, f"{type(e).__name__}: {e}", retryable=True)
