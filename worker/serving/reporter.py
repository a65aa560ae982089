"""Rank 0's reports to the scheduler: `processing` before generation (a lease call's tasks in one
call), then one final report per task (succeeded, failed or released), delivered in lease order.

A task's post stage runs in a pool and may finish before an earlier task's; `settle` reports them in
the order they were leased, the ones finished together in one call (POST /v1/reports; one call per
task with a scheduler that lacks it). A final report that cannot be delivered is logged and dropped: the
lease then expires and the task is retried, and since object names derive from the task id the
retry cannot leave a second object. Every final report ends the task's lease renewal.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait

from protocol import ErrorCode, ErrorEnvelope, Report, ReportOutcome, TaskReport, TaskResult, was_cancelled
from worker.serving.heartbeat import WorkerState
from worker.serving.metrics import FAILED_PREFIX, Metrics
from worker.serving.queue_client import LeaseLost, NotFound, QueueClient, QueueError
from worker.serving.task import Task

log = logging.getLogger(__name__)

# What a task's post stage settles on: its result, its error, or None when its lease was lost (a
# newer attempt owns the task and reports it).
Settled = TaskResult | ErrorEnvelope | None


def failure(code: ErrorCode, message: str, *, retryable: bool, details: dict | None = None) -> ErrorEnvelope:
    """The reporter logs it with the task id and adds the worker id when it reports."""
    return ErrorEnvelope(code=code, message=message[:4000], retryable=retryable, details=details)


class Reporter:
    def __init__(self, client: QueueClient, worker_id: Callable[[], str], state: WorkerState,
                 deadline_s: float, metrics: Metrics | None = None,
                 discard: Callable[[Task, TaskResult], None] | None = None) -> None:
        self._client = client
        self._metrics = metrics
        self._discard = discard  # removes a stored result whose task a client cancelled meanwhile
        self._worker_id = worker_id  # read at report time: a re-registration changes it
        self._state = state
        self._deadline_s = deadline_s  # retries of one report; then the lease expiry takes over
        self._pending: deque[tuple[Task, Future]] = deque()  # in post stages, in lease order
        self._batching = True  # off once the scheduler shows it has no POST /v1/reports

    # ------------------------------------------------------------ per task

    def processing_all(self, tasks: list[Task]) -> list[Task]:
        """`processing` for tasks about to wait for a round (renews their leases), in one call when
        there are several. Returns those that may run; the others (lease lost, or the report not
        delivered) are ended here and must not run."""
        if len(tasks) > 1 and self._batching:
            try:
                outcomes = self._send_batch([(t, self._report(t, "processing")) for t in tasks])
            except NotFound:
                self._no_batches()
            except QueueError as e:  # undeliverable within the deadline: none may run, none retried alone
                return [t for t in tasks if self._may_run(t, 503, str(e))]
            else:
                return [t for t, out in zip(tasks, outcomes) if self._may_run(t, out.status_code, out.detail)]
        return [t for t in tasks if self._processing(t)]

    def _processing(self, task: Task) -> bool:
        try:
            self._client.report(task.id, self._report(task, "processing"), deadline_s=self._deadline_s)
        except QueueError as e:
            return self._may_run(task, 409 if isinstance(e, LeaseLost) else 503, str(e))
        return True

    def _may_run(self, task: Task, status_code: int, detail: str | None) -> bool:
        if status_code == 200:
            return True
        if status_code == 409:
            self._state.count("tasks_cancelled" if was_cancelled(detail) else "leases_lost")
        log.warning("task %s dropped before generation (%d): %s", task.id, status_code, detail,
                    extra=task.fields(stage="admit"))
        self._state.end(task)
        return False

    def fail(self, task: Task, code: ErrorCode, message: str, *, retryable: bool,
             details: dict | None = None, deadline_s: float | None = None) -> None:
        """Reports the failure now, whatever stage the task is in."""
        log.info("task %s failed: %s: %s", task.id, code, message,
                 extra=task.fields(error_code=str(code), duration_ms=task.age_ms()))
        error = failure(code, message, retryable=retryable, details=details)
        self._send(task, self._report(task, "failed", error=error.model_copy(update={"worker_id": self._worker_id()})),
                   deadline_s)

    def cancelled(self, task: Task, when: str) -> None:
        """A task a client cancelled, dropped by this worker: the report ends it `cancelled`."""
        self.fail(task, ErrorCode.CANCELLED, f"cancelled by a client {when}", retryable=False)

    def release(self, task: Task, deadline_s: float | None = None) -> None:
        """Leased but never started: back in the queue at once, and the attempt does not count."""
        self._send(task, self._report(task, "released"), deadline_s)

    def deliver_all(self, done: list[tuple[Task, Settled]]) -> None:
        """Final reports of finished tasks, in one call when there are several."""
        sends = []
        for task, settled in done:
            if self._state.is_cancelled(task):  # told by the heartbeat after the image was stored
                if isinstance(settled, TaskResult) and self._discard is not None:
                    self._discard(task, settled)
                error = failure(ErrorCode.CANCELLED, "cancelled by a client; the result was discarded",
                                retryable=False)
                sends.append((task, self._report(task, "failed", error=error.model_copy(
                    update={"worker_id": self._worker_id()}))))
            elif settled is None or self._state.is_lost(task):  # a newer attempt reports, or it was failed late
                self._state.end(task)
            elif isinstance(settled, ErrorEnvelope):
                log.info("task %s failed: %s: %s", task.id, settled.code, settled.message,
                         extra=task.fields(error_code=str(settled.code), duration_ms=task.age_ms()))
                error = settled.model_copy(update={"worker_id": self._worker_id()})
                sends.append((task, self._report(task, "failed", error=error)))
            else:
                sends.append((task, self._report(task, "succeeded", result=settled)))
        if len(sends) > 1 and self._batching:
            self._send_together(sends)
        else:
            for task, report in sends:
                self._send(task, report)

    # ------------------------------------------------------------ lease order

    def track(self, task: Task, post: Future) -> None:
        """A task handed to the post stage; reported by `settle` once it and every earlier one are."""
        self._pending.append((task, post))

    def settle(self, limit: int, keepalive: Callable[[], None], every_s: float) -> None:
        """Reports finished post stages in lease order, and waits until at most `limit` tasks are
        pending, calling `keepalive` (the followers wait in a collective) every `every_s` meanwhile."""
        while self._pending:
            task, post = self._pending[0]
            # Failed by the watchdog, or lost: not waited for. A cancelled one is: it reports `cancelled`.
            if self._state.is_lost(task) and not self._state.is_cancelled(task) and not post.done():
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
                done.append((task, _outcome(task, post)))
            self.deliver_all(done)

    @property
    def pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------ plumbing

    def _report(self, task: Task, status: str, **payload) -> Report:
        return Report(worker_id=self._worker_id(), lease_token=task.lease.lease_token, status=status, **payload)

    def _send_batch(self, sends: list[tuple[Task, Report]]) -> list[ReportOutcome]:
        return self._client.report_many([TaskReport(task_id=t.id, **r.model_dump()) for t, r in sends],
                                        deadline_s=self._deadline_s)

    def _send_together(self, sends: list[tuple[Task, Report]]) -> None:
        t0 = time.perf_counter()
        try:
            outcomes = self._send_batch(sends)
        except NotFound:
            self._no_batches()
            for task, report in sends:
                self._send(task, report)
            return
        except QueueError as e:
            log.error("%d report(s) undeliverable, leases will expire: %s", len(sends), e)
            for task, _ in sends:
                self._state.end(task)
            return
        share_us = int((time.perf_counter() - t0) * 1e6 / len(sends))
        for (task, report), out in zip(sends, outcomes):
            try:
                if out.status_code == 409:
                    self._refused(task, report, out.detail)
                elif out.status_code != 200:
                    log.error("task %s: report refused (%d): %s", task.id, out.status_code, out.detail,
                              extra=task.fields(stage="report"))
                else:
                    self._delivered(task, report, share_us)
            finally:
                self._state.end(task)

    def _refused(self, task: Task, rep: Report, detail: str | None) -> None:
        """A 409: the task was cancelled by a client (it is now `cancelled`; a stored result is
        removed), or its lease belongs to a newer attempt (which reports it)."""
        if was_cancelled(detail):
            self._state.count("tasks_cancelled")
            log.info("task %s cancelled by a client", task.id, extra=task.fields(status="cancelled"))
            if rep.status == "succeeded" and self._discard is not None:
                self._discard(task, rep.result)
            return
        self._state.count("leases_lost")
        log.warning("task %s: lease lost, result not reported: %s", task.id, detail, extra=task.fields(stage="report"))

    def _no_batches(self) -> None:
        """An older scheduler, without POST /v1/reports: one call per report from now on."""
        log.info("the scheduler has no POST /v1/reports; reporting one task per call")
        self._batching = False

    def _delivered(self, task: Task, rep: Report, elapsed_us: int) -> None:
        self._state.count(f"tasks_{rep.status}")
        if rep.status == "failed":
            self._state.count(f"{FAILED_PREFIX}{rep.error.code}")
        self._state.count("report_us_total", elapsed_us)
        self._state.count("reports")
        if self._metrics is not None and rep.status != "released":
            self._metrics.task_reported({**task.timings.as_dict(), "report": elapsed_us / 1e3})
        if rep.status == "succeeded":
            log.info("task %s succeeded: %s", task.id, rep.result.uri, extra=task.fields(
                stage="report", status="succeeded", duration_ms=task.age_ms(), timings_ms=rep.result.timings_ms))

    def _send(self, task: Task, rep: Report, deadline_s: float | None = None) -> None:
        t0 = time.perf_counter()
        try:
            self._client.report(task.id, rep, deadline_s=deadline_s or self._deadline_s)
        except LeaseLost as e:
            self._refused(task, rep, str(e))
        except QueueError as e:
            log.error("task %s: report undeliverable, lease will expire: %s", task.id, e,
                      extra=task.fields(stage="report"))
        else:
            self._delivered(task, rep, int((time.perf_counter() - t0) * 1e6))
        finally:
            self._state.end(task)


def _outcome(task: Task, post: Future) -> Settled:
    try:
        return post.result()
    except Exception as e:  # a bug in the post stage: fail the task, keep serving
        log.exception("task %s: post-processing failed", task.id, extra=task.fields(stage="post"))
        return failure(ErrorCode.INTERNAL_ERROR, f"{type(e).__name__}: {e}", retryable=True)
