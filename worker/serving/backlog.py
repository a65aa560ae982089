"""The tasks handed to the post stage and not yet reported, in lease order. Post stages run in a
pool and may finish before an earlier task's; their final reports still go in the order the tasks
were leased, the ones finished together in one call. The calls go out on a thread of their own, one
at a time: a report sent from the serve loop left the GPU idle for its round trip between rounds
(about 11 ms an image on an H100). A task counts as unreported until its call has been answered. The
serve loop waits here for room before each round (its `settle` time) and for everything at the end;
an error in sending (the scheduler refusing this worker) is raised there."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

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
        self._pending: deque[tuple[Task, Future]] = deque()  # (task, its post stage), in lease order
        self._sending: deque[tuple[int, Future]] = deque()  # (tasks in it, the call), in lease order
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="report-sender")

    def add(self, task: Task, post: Future) -> None:
        """A task handed to the post stage; reported once it and every earlier one are finished."""
        self._pending.append((task, post))

    def __len__(self) -> int:
        return len(self._pending) + sum(n for n, _ in self._sending)

    def report_down_to(self, limit: int, keepalive: Callable[[], None], every_s: float) -> None:
        """Sends the finished post stages' reports in lease order, and waits until at most `limit`
        tasks are unreported, calling `keepalive` (the followers wait in a collective) every
        `every_s` meanwhile."""
        while True:
            self._answered()
            self._hand_over()
            if len(self) <= limit:
                return
            oldest = self._sending[0][1] if self._sending else self._pending[0][1]
            if not wait([oldest], timeout=every_s).done:
                keepalive()

    def _hand_over(self) -> None:
        """Every finished post stage at the head goes to the sender, in one call."""
        done = []
        while self._pending:
            task, post = self._pending[0]
            # Failed by the watchdog, or lost: not waited for. A cancelled one is: it reports `cancelled`.
            if self._ledger.dropped(task) and not post.done():
                self._pending.popleft()
                continue
            if not post.done():
                break
            self._pending.popleft()
            done.append((task, _result(task, post)))
        if done:
            self._sending.append((len(done), self._sender.submit(self._reporter.finals, done)))

    def _answered(self) -> None:
        while self._sending and self._sending[0][1].done():
            _, call = self._sending.popleft()
            call.result()  # what the sender raised is the serve loop's


def _result(task: Task, post: Future) -> PostResult:
    try:
        return post.result()
    except Exception as e:  # a bug in the post stage: fail the task, keep serving
        log.exception("task %s: post-processing failed", task.id, extra=task.fields(stage="post"))
        return failure(ErrorCode.INTERNAL_ERROR, f"{type(e).__name__}: {e}", retryable=True)
