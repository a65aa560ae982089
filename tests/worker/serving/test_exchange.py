"""Rank 0's exchange (worker.serving.exchange): the admission's `processing` notes ride with the next
call, a final report carries the intake's held request for more tasks, what the answer says of a
note reaches the ledger, and an older scheduler turns the exchange off. The scheduler is a fake
here (its own tests are tests/scheduler/test_exchange.py); QueueClient.exchange's retries run
against httpx's mock transport."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from protocol import Exchange, Exchanged, Lease, Report, ReportOutcome, TaskResult
from worker.config import QueueConfig
from worker.serving.exchange import Receipt
from worker.serving.exchange import Exchanger
from worker.serving.ledger import Fate, Ledger
from worker.serving.queue_client import NotFound, QueueClient, Unavailable
from worker.serving.task import Task

RESULT = TaskResult(uri="file:///x.png", content_type="image/png", width=16, height=16, seed=1, bytes=1,
                    sha256="0" * 64)


def lease(task_id: str) -> Lease:
    return Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                 lease_ttl_s=10.0, attempt=1)


def report(status: str, **extra) -> Report:
    return Report(worker_id="w", lease_token="tok", status=status, **extra)


class FakeScheduler:
    """Answers each exchange: every report 200 unless `codes` says otherwise, `leases` handed out
    up to max_tasks; or raises `fail` once."""

    def __init__(self) -> None:
        self.bodies: list[Exchange] = []
        self.codes: dict[str, tuple[int, str]] = {}
        self.leases: list[Lease] = []
        self.cancelled: list[str] = []
        self.fail: Exception | None = None
        self.called = threading.Event()

    def exchange(self, worker_id: str, body: Exchange, deadline_s: float) -> Exchanged:
        self.bodies.append(body)
        self.called.set()
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        given, self.leases = self.leases[:body.max_tasks], self.leases[body.max_tasks:]
        results = [ReportOutcome(task_id=r.task_id, status_code=self.codes.get(r.task_id, (200, None))[0],
                                 detail=self.codes.get(r.task_id, (200, None))[1]) for r in body.reports]
        return Exchanged(results=results, leases=given, cancelled=[t for t in self.cancelled if t in body.held])


@pytest.fixture
def world():
    ledger = Ledger()
    plain: list[list[tuple[str, Report]]] = []

    def send_plain(reports, deadline_s):
        plain.append(reports)
        return [Receipt(200) for _ in reports]

    sched = FakeScheduler()
    ex = Exchanger(sched, lambda: "w", ledger, send_plain, deadline_s=5.0, hold_s=30.0)
    return ex, sched, ledger, plain


def held(ledger: Ledger, *ids: str) -> dict[str, Task]:
    tasks = {i: Task(lease(i)) for i in ids}
    for task in tasks.values():
        ledger.hold(task)
    return tasks


def test_notes_ride_with_the_next_report_and_their_answers_are_not_the_senders(world):
    ex, sched, ledger, _ = world
    held(ledger, "a", "b")
    ex.note([("a", report("processing", at=1.0))])
    receipts = ex.send([("b", report("succeeded", result=RESULT))], 5.0)
    assert receipts == [Receipt(200, None, receipts[0].elapsed_us)]
    (body,) = sched.bodies
    assert [(r.task_id, r.status, r.at) for r in body.reports] == [("a", "processing", 1.0), ("b", "succeeded", None)]
    assert body.held == ["a"]  # b's final is in the call: only a can still be cancelled
    assert body.max_tasks == 0  # the intake held no request


def test_a_final_report_carries_the_intakes_held_request_and_hands_it_the_tasks(world):
    ex, sched, ledger, _ = world
    held(ledger, "a")
    sched.leases = [lease("n1"), lease("n2"), lease("n3")]
    got: list = []
    intake = threading.Thread(target=lambda: got.append(ex.hold(2, None, 30.0, lambda: False)))
    intake.start()
    while ex.outbox._request is None:  # the intake has parked its request
        threading.Event().wait(0.001)
    ex.send([("a", report("succeeded", result=RESULT))], 5.0)
    intake.join(5.0)
    assert [le.task_id for le in got[0]] == ["n1", "n2"]
    assert len(sched.bodies) == 1 and sched.bodies[0].max_tasks == 2 and sched.bodies[0].wait_s == 0.0


def test_a_held_request_ends_when_woken_and_is_asked_on_its_own(world):
    ex, sched, _, _ = world
    hungry = threading.Event()
    out: list = []
    intake = threading.Thread(target=lambda: out.append(ex.hold(1, None, 30.0, hungry.is_set)))
    intake.start()
    hungry.set()
    ex.wake()
    intake.join(5.0)
    assert out == [None] and sched.bodies == []  # not carried: the intake asks now
    sched.leases = [lease("n1")]
    assert [le.task_id for le in ex.ask(1, 10.0, None, 5.0)] == ["n1"]
    assert sched.bodies[0].wait_s == 10.0


def test_a_refused_note_reaches_the_ledger(world):
    ex, sched, ledger, _ = world
    tasks = held(ledger, "gone", "cancelled", "fine")
    sched.codes = {"gone": (409, "lease on task gone is not held by this token"),
                   "cancelled": (409, "task cancelled was cancelled by a client; its processing report is refused")}
    ex.note([(t, report("processing", at=1.0)) for t in tasks])
    ex.ask(1, 0.0, None, 5.0)
    assert ledger.fate(tasks["gone"]) is Fate.LOST
    assert ledger.fate(tasks["cancelled"]) is Fate.CANCELLED
    assert ledger.fate(tasks["fine"]) is Fate.LIVE


def test_cancel_notices_for_held_tasks_reach_the_ledger(world):
    ex, sched, ledger, _ = world
    tasks = held(ledger, "a", "b")
    sched.cancelled = ["b"]
    ex.ask(1, 0.0, None, 5.0)
    assert sorted(sched.bodies[0].held) == ["a", "b"]
    assert ledger.cancelled(tasks["b"]) and not ledger.cancelled(tasks["a"])


def test_undelivered_notes_go_again_with_the_next_call(world):
    ex, sched, ledger, _ = world
    held(ledger, "a", "b")
    ex.note([("a", report("processing", at=1.0))])
    sched.fail = Unavailable("down")
    assert ex.send([("b", report("succeeded", result=RESULT))], 5.0) == [Receipt(None, "down")]
    ex.ask(1, 0.0, None, 5.0)
    assert [r.task_id for r in sched.bodies[1].reports] == ["a"]


def test_an_older_scheduler_turns_the_exchange_off_and_nothing_is_lost(world):
    ex, sched, ledger, plain = world
    held(ledger, "a", "b")
    ex.note([("a", report("processing", at=1.0))])
    sched.fail = NotFound("POST http://s/v1/workers/w/exchange: Not Found")
    assert ex.send([("b", report("succeeded", result=RESULT))], 5.0) == [Receipt(200)]
    assert not ex.enabled
    assert [[t for t, _ in call] for call in plain] == [["a"], ["b"]]


def test_a_scheduler_that_forgot_the_worker_is_not_an_older_one(world):
    ex, sched, ledger, _ = world
    sched.fail = NotFound("POST http://s/v1/workers/w/exchange: no worker w; register first")
    with pytest.raises(NotFound):
        ex.ask(1, 0.0, None, 5.0)
    assert ex.enabled


def test_a_note_no_call_took_goes_alone_after_the_hold():
    ledger, sched = Ledger(), FakeScheduler()
    held(ledger, "a")
    ex = Exchanger(sched, lambda: "w", ledger, lambda reports, _: [], deadline_s=5.0, hold_s=0.01)
    ex.note([("a", report("processing", at=1.0))])
    assert sched.called.wait(5.0)
    assert [(r.task_id, r.status) for r in sched.bodies[0].reports] == [("a", "processing")]
    assert sched.bodies[0].max_tasks == 0


def test_the_clients_retries_are_the_same_exchange_marked_as_retries():
    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        if len(sent) == 1:
            return httpx.Response(503, json={"detail": "busy"}, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"results": [], "leases": [], "cancelled": []})

    client = QueueClient(QueueConfig(url="http://s"), None, transport=httpx.MockTransport(answer))
    client.exchange("w", Exchange(exchange_id="e-1", max_tasks=1), deadline_s=5.0)
    assert [(b["exchange_id"], b["retry"]) for b in sent] == [("e-1", False), ("e-1", True)]
