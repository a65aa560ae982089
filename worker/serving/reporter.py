"""Rank 0's reports to the scheduler: `processing` before generation (a lease call's tasks in one
call, or, with the exchange, in the next call, whenever that is), then one final report per task
(succeeded, failed or released). The backlog hands it the
finished post stages in lease order; the ledger says which of them are reported, and how.

A final report that cannot be delivered is logged and dropped: the lease then expires and the task is
retried, and since object names derive from the task id the retry cannot leave a second object. Every
final report ends the task in the ledger, which ends its lease renewal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from protocol import ErrorCode, ErrorEnvelope, Report, TaskResult, was_cancelled
from worker.serving.delivery import Delivery
from worker.serving.exchange import Exchanger, Receipt
from worker.serving.ledger import REPORTED, Counter, Ledger
from worker.serving.metrics import Metrics
from worker.serving.queue_client import QueueClient
from worker.serving.results import PostResult, failure
from worker.serving.task import Task

log = logging.getLogger(__name__)


class Reporter:
    def __init__(self, client: QueueClient, worker_id: Callable[[], str], ledger: Ledger,
                 deadline_s: float, metrics: Metrics | None = None,
                 discard: Callable[[Task, TaskResult], None] | None = None, exchange_hold_s: float | None = None) -> None:
        self.delivery = Delivery(client, deadline_s)
        if exchange_hold_s is not None:  # one call per task (queue.exchange, queue.lease_hold_s)
            self.delivery.exchanger = Exchanger(client, worker_id, ledger, self.delivery.plain, deadline_s,
                                                exchange_hold_s)
        self._worker_id = worker_id  # read at report time: a re-registration changes it
        self._ledger = ledger
        self._receipts = Receipts(ledger, metrics, discard)

    def processing_all(self, tasks: list[Task]) -> list[Task]:
        """`processing` for tasks about to wait for a round (renews their leases), in one call when
        there are several. Returns those that may run; the others (lease lost, or the report not
        delivered) are ended here and must not run. With the exchange, they wait for the next call,
        each saying when it started, and all may run: what their answers say reaches the ledger."""
        if self.delivery.note([(t.id, self._report(t, "processing", at=time.time())) for t in tasks]):
            return tasks
        answers = self.delivery.send([(t.id, self._report(t, "processing")) for t in tasks])
        return [t for t, answer in zip(tasks, answers) if self._may_run(t, answer)]

    def _may_run(self, task: Task, answer: Receipt) -> bool:
        if answer.code == 200:
            return True
        if answer.code == 409:
            self._ledger.counters.add(Counter.TASKS_CANCELLED if was_cancelled(answer.detail) else Counter.LEASES_LOST)
        log.warning("task %s dropped before generation (%s): %s", task.id, answer.code or "not delivered",
                    answer.detail, extra=task.fields(stage="admit"))
        self._ledger.end(task)
        return False

    def fail(self, task: Task, code: ErrorCode, message: str, *, retryable: bool,
             details: dict | None = None, deadline_s: float | None = None) -> None:
        """Reports the failure now, whatever stage the task is in."""
        self._send([(task, self._failed(task, failure(code, message, retryable=retryable, details=details)))],
                   deadline_s)

    def cancelled(self, task: Task, when: str) -> None:
        """A task a client cancelled, dropped by this worker: the report ends it `cancelled`."""
        self.fail(task, ErrorCode.CANCELLED, f"cancelled by a client {when}", retryable=False)

    def release(self, task: Task, deadline_s: float | None = None) -> None:
        """Leased but never started: back in the queue at once, and the attempt does not count."""
        self._send([(task, self._report(task, "released"))], deadline_s)

    def finals(self, done: list[tuple[Task, PostResult]]) -> None:
        """Final reports of finished post stages, in one call when there are several."""
        self._send([sent for task, result in done if (sent := self._final(task, result)) is not None])

    def _final(self, task: Task, result: PostResult) -> tuple[Task, Report] | None:
        if self._ledger.cancelled(task):  # told by the heartbeat after the image was stored
            self._receipts.discard(task, result)
            error = failure(ErrorCode.CANCELLED, "cancelled by a client; the result was discarded", retryable=False)
            return task, self._report(task, "failed", error=error.model_copy(update={"worker_id": self._worker_id()}))
        if result is None or self._ledger.dropped(task):  # a newer attempt reports, or it was failed late
            self._ledger.end(task)
            return None
        if isinstance(result, ErrorEnvelope):
            return task, self._failed(task, result)
        return task, self._report(task, "succeeded", result=result)

    def _send(self, sends: list[tuple[Task, Report]], deadline_s: float | None = None) -> None:
        answers = self.delivery.send([(task.id, report) for task, report in sends], deadline_s)
        for (task, report), answer in zip(sends, answers):
            try:
                self._receipts.answered(task, report, answer)
            finally:
                self._ledger.end(task)

    def _failed(self, task: Task, error: ErrorEnvelope) -> Report:
        log.info("task %s failed: %s: %s", task.id, error.code, error.message,
                 extra=task.fields(error_code=str(error.code), duration_ms=task.age_ms()))
        return self._report(task, "failed", error=error.model_copy(update={"worker_id": self._worker_id()}))

    def _report(self, task: Task, status: str, **payload) -> Report:
        return Report(worker_id=self._worker_id(), lease_token=task.lease.lease_token, status=status, **payload)


class Receipts:
    """What the scheduler's answer to a final report means: counted, observed, logged; a stored
    result of a task a client cancelled meanwhile is removed."""

    def __init__(self, ledger: Ledger, metrics: Metrics | None,
                 discard: Callable[[Task, TaskResult], None] | None) -> None:
        self._counters = ledger.counters
        self._metrics = metrics
        self._discard = discard  # removes a stored result whose task a client cancelled meanwhile

    def answered(self, task: Task, report: Report, answer: Receipt) -> None:
        if answer.code == 200:
            self._delivered(task, report, answer.elapsed_us)
        elif answer.code == 409:
            self._refused(task, report, answer.detail)
        elif answer.code is None:
            log.error("task %s: report undeliverable, lease will expire: %s", task.id, answer.detail,
                      extra=task.fields(stage="report"))
        else:
            log.error("task %s: report refused (%d): %s", task.id, answer.code, answer.detail,
                      extra=task.fields(stage="report"))

    def discard(self, task: Task, result: PostResult) -> None:
        if isinstance(result, TaskResult) and self._discard is not None:
            self._discard(task, result)

    def _refused(self, task: Task, report: Report, detail: str | None) -> None:
        """A 409: the task was cancelled by a client (it is now `cancelled`; a stored result is
        removed), or its lease belongs to a newer attempt (which reports it)."""
        if was_cancelled(detail):
            self._counters.add(Counter.TASKS_CANCELLED)
            log.info("task %s cancelled by a client", task.id, extra=task.fields(status="cancelled"))
            if report.status == "succeeded":
                self.discard(task, report.result)
            return
        self._counters.add(Counter.LEASES_LOST)
        log.warning("task %s: lease lost, result not reported: %s", task.id, detail, extra=task.fields(stage="report"))

    def _delivered(self, task: Task, report: Report, elapsed_us: int) -> None:
        self._counters.add(REPORTED[report.status])
        if report.status == "failed":
            self._counters.failed(report.error.code)
        self._counters.add(Counter.REPORT_US_TOTAL, elapsed_us)
        self._counters.add(Counter.REPORTS)
        if self._metrics is not None and report.status != "released":
            self._metrics.task_reported({**task.timings.as_dict(), "report": elapsed_us / 1e3})
        if report.status == "succeeded":
            log.info("task %s succeeded: %s", task.id, report.result.uri, extra=task.fields(
                stage="report", status="succeeded", duration_ms=task.age_ms(), timings_ms=report.result.timings_ms))
