"""Rank 0's one call per task (POST /v1/workers/{wid}/exchange, docs/protocol.md "One call per
task"): the intake's request for more tasks and the reports waiting to go travel in one call.

Two kinds of report wait here:
- notes: the `processing` report of each task the admission let through, with the time it did
  (`at`). Nobody waits for them: they ride with the next call, whoever makes it.
- reports someone waits for (final reports, failures, releases): they go at once, in a call of
  their sender's own, which also carries the notes and, when the intake is holding its request for
  more tasks (`hold`), that request; the tasks it gets are handed to the intake.

The intake holds its request only while it still has a round ready, and at most
`queue.lease_hold_s`; a note waits at most as long, then goes in a call of its own. A single-GPU
worker's result, ready while the next task generates, thus carries the next request and the notes,
and the task costs the scheduler one call. A worker with nothing ready asks at once, long-polling.

What an answer says about a note: 200, the task is processing; 409 cancelled or lease lost, and 404,
told to the ledger (the serve loop drops a cancelled task before its round; a lost one's result is
not reported). An undelivered note goes again with the next call. Cancel notices for the tasks held
go to the ledger as a heartbeat's do.

A scheduler without the exchange (404 Not Found) turns it off for good: the worker goes on with
separate lease and report calls (`enabled`)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol import Exchange, Exchanged, Lease, Report, TaskReport, was_cancelled
from worker.serving.ledger import Ledger
from worker.serving.queue_client import NotFound, QueueClient, QueueError, no_exchange

MAX_REPORTS = 256  # in one exchange (protocol.Exchange)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Receipt:
    """The scheduler's answer to one report: its status code (200 taken; 409 refused because the
    lease is lost or a client cancelled the task, as `detail` says), or None: not delivered in time."""

    code: int | None
    detail: str | None = None
    elapsed_us: int = 0  # the report's share of its call


Send = Callable[[list[tuple[str, Report]], float], list[Receipt]]


class NoExchange(Exception):
    """The scheduler has no exchange: use the separate calls."""


@dataclass(eq=False)
class _Request:
    """The intake's request for more tasks, held for a report to carry."""

    n: int
    resident: list[str] | None
    adapters: list[str] | None = None
    taken: bool = False  # a sender's call carries it
    answered: bool = False
    leases: list[Lease] = field(default_factory=list)


class Outbox:
    """What waits for the next exchange, whoever makes it: the admission's notes, and the intake's
    request for more tasks while it holds one. Notes that no call took within `note_s` are handed
    to `due` (on a timer thread), which sends them in a call of their own."""

    def __init__(self, note_s: float = 0.0, due: Callable[[], None] = lambda: None) -> None:
        self._cond = threading.Condition()
        self._notes: list[tuple[str, Report]] = []
        self._request: _Request | None = None
        self._note_s = note_s
        self._due = due
        self._timer: threading.Timer | None = None

    def note(self, items: list[tuple[str, Report]]) -> None:
        with self._cond:
            self._notes.extend(items)
            if self._timer is None:
                self._timer = threading.Timer(self._note_s, self._overdue)
                self._timer.daemon = True
                self._timer.start()

    def _overdue(self) -> None:
        with self._cond:
            self._timer = None
            waiting = bool(self._notes)
        if waiting:
            self._due()

    def take(self, room: int, request: bool = False) -> tuple[list[tuple[str, Report]], _Request | None]:
        """The oldest notes one call has room for, and (`request`) the held request, now carried."""
        with self._cond:
            notes, self._notes = self._notes[:max(0, room)], self._notes[max(0, room):]
            held = self._request if request and self._request is not None and not self._request.taken else None
            if held is not None:
                held.taken = True
        return notes, held

    def again(self, notes: list[tuple[str, Report]]) -> None:
        """Notes not delivered go with the next call (a `processing` report applies once)."""
        if notes:
            with self._cond:
                self._notes[:0] = notes

    def answer(self, request: _Request, leases: list[Lease]) -> None:
        """The carrying call ended: its leases (none if it failed) are the intake's."""
        with self._cond:
            request.leases, request.answered = leases, True
            self._cond.notify_all()

    def hold(self, n: int, resident: list[str] | None, hold_s: float, wake: Callable[[], bool],
             adapters: list[str] | None = None) -> list[Lease] | None:
        """Holds a request for up to n tasks for a sender's call to carry, for at most `hold_s` or
        until `wake()` (fewer ready, or stopping). The tasks it got ([]: carried, and none were
        left); None: not carried, ask now."""
        request = _Request(n, resident, adapters)
        end = time.monotonic() + hold_s
        with self._cond:
            self._request = request
            while not request.taken and not wake() and (left := end - time.monotonic()) > 0:
                self._cond.wait(min(left, 0.25))
            if self._request is request:
                self._request = None
            if not request.taken:
                return None
            while not request.answered:  # a sender's call is under way with it: its answer is ours
                self._cond.wait()
            return request.leases

    def wake(self) -> None:
        """A held request's `wake` condition may have changed."""
        with self._cond:
            self._cond.notify_all()


class Exchanger:
    def __init__(self, client: QueueClient, worker_id: Callable[[], str], ledger: Ledger, plain: Send,
                 deadline_s: float, hold_s: float = 0.0) -> None:
        self._client = client
        self._plain = plain  # separate report calls: the notes' way once the exchange is off
        self._deadline_s = deadline_s
        self._worker_id = worker_id  # read per call: a re-registration changes it
        self._ledger = ledger
        self.outbox = Outbox(hold_s, self._notes_alone)  # a note waits at most hold_s for a call
        self.enabled = True

    def note(self, items: list[tuple[str, Report]]) -> None:
        """`processing` reports that go with the next call."""
        self.outbox.note(items)

    def send(self, reports: list[tuple[str, Report]], deadline_s: float) -> list[Receipt]:
        """Delivered now, in one call carrying the notes and the intake's held request too; each
        report's outcome, in order (in separate calls once the scheduler shows it has no exchange)."""
        notes, request = self.outbox.take(MAX_REPORTS - len(reports), request=True)
        leases: list[Lease] = []
        try:
            body = self._body(notes + reports, request.n if request else 0, 0.0, request.resident if request else None,
                              request.adapters if request else None)
            t0 = time.perf_counter()
            try:
                answer = self._client.exchange(self._worker_id(), body, deadline_s)
            except NotFound as e:
                if no_exchange(e):
                    self._off(notes)
                    return self._plain(reports, deadline_s)
                self.outbox.again(notes)
                return [Receipt(None, str(e)) for _ in reports]
            except QueueError as e:
                self.outbox.again(notes)
                return [Receipt(None, str(e)) for _ in reports]
            leases = answer.leases
            share_us = int((time.perf_counter() - t0) * 1e6 / max(1, len(notes) + len(reports)))
            self._told(notes, answer)
            return [Receipt(r.status_code, r.detail, share_us) for r in answer.results[len(notes):]]
        finally:
            if request is not None:
                self.outbox.answer(request, leases)

    def hold(self, n: int, resident: list[str] | None, hold_s: float, wake: Callable[[], bool],
             adapters: list[str] | None = None) -> list[Lease] | None:
        return self.outbox.hold(n, resident, hold_s, wake, adapters)

    def wake(self) -> None:
        self.outbox.wake()

    def _notes_alone(self) -> None:
        """Notes that waited `hold_s` for a call: sent in one of their own."""
        try:
            self.ask(0, 0.0, None, self._deadline_s)
        except (QueueError, NoExchange) as e:  # kept for the next call, or gone as separate reports
            log.info("the start of tasks not reported yet: %s", e)

    def ask(self, n: int, wait_s: float, resident: list[str] | None, deadline_s: float,
            adapters: list[str] | None = None) -> list[Lease]:
        """The intake's own call: the notes waiting, and a request for up to n tasks, long-polling
        up to wait_s. QueueError as a lease call raises it (NotFound: register again);
        NoExchange when the scheduler has none."""
        notes, _ = self.outbox.take(MAX_REPORTS)
        try:
            answer = self._client.exchange(self._worker_id(), self._body(notes, n, wait_s, resident, adapters),
                                           deadline_s)
        except NotFound as e:
            if no_exchange(e):
                self._off(notes)
                raise NoExchange(str(e)) from e
            self.outbox.again(notes)
            raise
        except QueueError:
            self.outbox.again(notes)
            raise
        self._told(notes, answer)
        return answer.leases

    def _body(self, reports: list[tuple[str, Report]], n: int, wait_s: float, resident: list[str] | None,
              adapters: list[str] | None = None) -> Exchange:
        final = {task_id for task_id, r in reports if r.status != "processing"}
        return Exchange(exchange_id=uuid.uuid4().hex, max_tasks=n, wait_s=wait_s, resident=resident, adapters=adapters,
                        reports=[TaskReport(task_id=t, **r.model_dump()) for t, r in reports],
                        held=[t for t in self._ledger.in_flight() if t not in final])

    def _told(self, notes: list[tuple[str, Report]], answer: Exchanged) -> None:
        """What the answer says of the notes and of the tasks held."""
        self._started(notes, [Receipt(r.status_code, r.detail) for r in answer.results[:len(notes)]])
        if answer.cancelled and (fresh := self._ledger.mark_cancelled(answer.cancelled)):
            log.info("cancelled by a client: %s", ", ".join(fresh))

    def _started(self, notes: list[tuple[str, Report]], receipts: list[Receipt]) -> None:
        """A refused note: the task was cancelled (dropped before its round, or its result removed)
        or is not this worker's any more (its result not reported)."""
        for (task_id, _), out in zip(notes, receipts):
            if out.code == 200:
                continue
            if out.code is None:
                log.warning("task %s: its start not delivered: %s", task_id, out.detail)
                continue  # the heartbeat renews its lease; its final report says the rest
            log.warning("task %s: its start was refused (%d): %s", task_id, out.code, out.detail)
            if out.code == 409 and was_cancelled(out.detail):
                self._ledger.mark_cancelled([task_id])
            else:
                self._ledger.mark_lost([task_id])

    def _off(self, notes: list[tuple[str, Report]]) -> None:
        """No exchange on this scheduler: the notes not sent go as separate reports, and from now on
        everything does."""
        log.info("the scheduler has no exchange; leasing and reporting in separate calls")
        self.enabled = False
        rest, _ = self.outbox.take(1 << 30)
        if notes + rest:
            self._started(notes + rest, self._plain(notes + rest, self._deadline_s))
