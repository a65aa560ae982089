"""Gets reports to the scheduler: in exchanges (worker.serving.exchange), where the `processing`
reports wait for the next call; else several in one call (POST /v1/reports), e.g. a lease call's
`processing` reports or the final reports of tasks finished together, or one call per report with a
scheduler that lacks it. Retries stay within a report's deadline (queue.report_deadline_s); what is
not delivered by then is answered as such, and the lease expiry takes over. What an answer means for
the task is the reporter's business."""

from __future__ import annotations

import logging
import time

from protocol import Report, TaskReport
from worker.serving.exchange import Exchanger, Receipt
from worker.serving.queue_client import LeaseLost, NotFound, QueueClient, QueueError

log = logging.getLogger(__name__)


class Delivery:
    def __init__(self, client: QueueClient, deadline_s: float) -> None:
        self._client = client
        self._deadline_s = deadline_s  # retries of one call; then the lease expiry takes over
        self.batching = True  # off once the scheduler shows it has no POST /v1/reports
        self.exchanger: Exchanger | None = None  # set: reports go in exchanges (worker.serving.exchange)

    def note(self, reports: list[tuple[str, Report]]) -> bool:
        """`processing` reports that may wait for the next exchange: True when they will, False when
        they must be sent (no exchange)."""
        if self.exchanger is None or not self.exchanger.enabled:
            return False
        self.exchanger.note(reports)
        return True

    def send(self, reports: list[tuple[str, Report]], deadline_s: float | None = None) -> list[Receipt]:
        """One answer per (task id, report), in order: all in one call when there are several
        (with the exchange, that call also carries what waits for one), else one call each.
        Several that cannot be delivered together are not sent again one by one."""
        deadline_s = deadline_s or self._deadline_s
        if self.exchanger is not None and self.exchanger.enabled:
            return self.exchanger.send(reports, deadline_s)
        return self.plain(reports, deadline_s)

    def plain(self, reports: list[tuple[str, Report]], deadline_s: float) -> list[Receipt]:
        """Reports in POST /v1/reports, or one call each."""
        if len(reports) > 1 and self.batching:
            try:
                return self._together(reports, deadline_s)
            except NotFound:
                log.info("the scheduler has no POST /v1/reports; reporting one task per call")
                self.batching = False
        return [self._alone(task_id, report, deadline_s) for task_id, report in reports]

    def _together(self, reports: list[tuple[str, Report]], deadline_s: float) -> list[Receipt]:
        t0 = time.perf_counter()
        try:
            outcomes = self._client.report_many([TaskReport(task_id=t, **r.model_dump()) for t, r in reports],
                                                deadline_s=deadline_s)
        except NotFound:
            raise
        except QueueError as e:
            return [Receipt(None, str(e)) for _ in reports]
        share_us = int((time.perf_counter() - t0) * 1e6 / len(reports))
        return [Receipt(out.status_code, out.detail, share_us) for out in outcomes]

    def _alone(self, task_id: str, report: Report, deadline_s: float) -> Receipt:
        t0 = time.perf_counter()
        try:
            self._client.report(task_id, report, deadline_s=deadline_s)
        except LeaseLost as e:
            return Receipt(409, str(e))
        except QueueError as e:
            return Receipt(None, str(e))
        return Receipt(200, elapsed_us=int((time.perf_counter() - t0) * 1e6))
