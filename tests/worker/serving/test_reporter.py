"""Rank 0's reports: post stages overlap, reports stay in lease order, and the serve loop's wait for
them (the backlog) lasts only down to its limit. Each fake post stage waits on a gate the test opens,
so the order is forced by events, not by sleeps."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from protocol import ErrorCode, Lease, ReportOutcome, TaskResult
from worker.serving.backlog import Backlog
from worker.serving.ledger import Fate, Ledger, Stage
from worker.serving.queue_client import NotFound
from worker.serving.reporter import Reporter
from worker.serving.results import failure
from worker.serving.task import Task


class RecordingClient:
    """Records each report in the order it reached the scheduler, and each call's size."""

    def __init__(self, batches: bool = True) -> None:
        self.reports: list[tuple[str, str]] = []
        self.calls: list[int] = []
        self.batches = batches

    def report(self, task_id, rep, deadline_s):
        self.reports.append((task_id, rep.status))
        self.calls.append(1)

    def report_many(self, reports, deadline_s):
        if not self.batches:  # an older scheduler: no POST /v1/reports
            raise NotFound("POST /v1/reports: Not Found")
        self.reports += [(r.task_id, r.status) for r in reports]
        self.calls.append(len(reports))
        return [ReportOutcome(task_id=r.task_id, status_code=200) for r in reports]


class GatedPost:
    """Each task's post stage waits for its gate, records that it finished, and settles."""

    def __init__(self, ids: str) -> None:
        self.gates = {t: threading.Event() for t in ids}
        self.finished: list[str] = []
        self._pool = ThreadPoolExecutor(len(ids))

    def submit(self, task: Task):
        return self._pool.submit(self._run, task)

    def _run(self, task: Task):
        assert self.gates[task.id].wait(10)
        self.finished.append(task.id)
        if task.id == "c":
            return failure(ErrorCode.STORAGE_UNAVAILABLE, "down", retryable=True)
        return TaskResult(uri=f"file:///{task.id}.png", content_type="image/png", width=64, height=64, seed=1,
                          bytes=1, sha256="0")


def task(task_id: str) -> Task:
    return Task(Lease(task_id=task_id, input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                      lease_ttl_s=10.0, attempt=1))


def backlog_of(client, ledger: Ledger | None = None, **kw) -> Backlog:
    ledger = ledger or Ledger()
    return Backlog(Reporter(client, lambda: "w-1", ledger, deadline_s=1.0, **kw), ledger)


@pytest.fixture
def reporter():
    client = RecordingClient()
    return backlog_of(client), client


def test_reports_follow_lease_order_while_post_stages_overlap(reporter):
    reporter, client = reporter
    post = GatedPost("abc")
    futures = {t: post.submit(task(t)) for t in "abc"}
    for t in "abc":  # handing over never waits for a post stage: every gate is still closed
        reporter.add(task(t), futures[t])
    post.gates["b"].set()  # b's and c's post stages finish before a's
    futures["b"].result(5)
    post.gates["c"].set()
    futures["c"].result(5)
    post.gates["a"].set()
    reporter.report_down_to(0, keepalive=lambda: None, every_s=0.05)
    assert post.finished[0] == "b"  # b finished first...
    assert client.reports == [("a", "succeeded"), ("b", "succeeded"), ("c", "failed")]  # ...reported after a
    assert client.calls == [3]  # finished together: one call


def test_the_wait_reports_what_is_done_and_leaves_the_rest(reporter):
    reporter, client = reporter
    post = GatedPost("ab")
    first = post.submit(task("a"))
    reporter.add(task("a"), first)
    reporter.add(task("b"), post.submit(task("b")))
    post.gates["a"].set()
    first.result(5)
    reporter.report_down_to(1, keepalive=lambda: None, every_s=0.05)
    assert client.reports == [("a", "succeeded")] and len(reporter) == 1
    keepalives = []
    threading.Timer(0.2, post.gates["b"].set).start()
    reporter.report_down_to(0, keepalive=lambda: keepalives.append(1), every_s=0.05)
    assert client.reports == [("a", "succeeded"), ("b", "succeeded")]
    assert keepalives  # the followers were kept alive while it waited


def test_a_post_stage_that_raises_fails_its_task_retryable(reporter):
    reporter, client = reporter
    pool = ThreadPoolExecutor(1)
    reporter.add(task("a"), pool.submit(lambda: 1 / 0))
    reporter.report_down_to(0, keepalive=lambda: None, every_s=0.05)
    assert client.reports == [("a", "failed")]


def test_the_wait_passes_over_a_task_the_watchdog_failed_while_its_post_stage_hangs():
    clock = Clock()
    ledger, client = Ledger(clock=clock), RecordingClient()
    reporter = backlog_of(client, ledger)
    post = GatedPost("ab")
    hung, done = task("a"), task("b")
    ledger.hold(hung, Stage.STORE)
    ledger.hold(done, Stage.STORE)
    reporter.add(hung, post.submit(hung))  # a's gate never opens: an upload that never returns
    second = post.submit(done)
    reporter.add(done, second)
    post.gates["b"].set()
    second.result(5)
    ledger.advance(done, Stage.REPORT)
    clock.now += 91  # past store_s: the watchdog failed it and reported that itself
    assert [h.task for h in ledger.overdue()] == [hung]
    ledger.end(hung)
    reporter.report_down_to(0, keepalive=lambda: None, every_s=0.05)
    assert client.reports == [("b", "succeeded")] and len(reporter) == 0
    post.gates["a"].set()


def test_with_a_scheduler_without_batch_reports_each_goes_alone_in_lease_order():
    client = RecordingClient(batches=False)
    reporter = backlog_of(client)
    post = GatedPost("abc")
    futures = {t: post.submit(task(t)) for t in "abc"}
    for t in "abc":
        reporter.add(task(t), futures[t])
        post.gates[t].set()
        futures[t].result(5)
    reporter.report_down_to(0, keepalive=lambda: None, every_s=0.05)
    assert client.reports == [("a", "succeeded"), ("b", "succeeded"), ("c", "failed")]
    assert client.calls == [1, 1, 1] and reporter._reporter.delivery.batching is False


class RefusingClient(RecordingClient):
    """Answers 409 (lease lost) for the tasks in `lost`, in a batch or alone."""

    def __init__(self, lost: set[str], batches: bool = True) -> None:
        super().__init__(batches)
        self.lost = lost

    def report(self, task_id, rep, deadline_s):
        from worker.serving.queue_client import LeaseLost

        super().report(task_id, rep, deadline_s)
        if task_id in self.lost:
            raise LeaseLost(f"{task_id}: 409 lease not held")

    def report_many(self, reports, deadline_s):
        out = super().report_many(reports, deadline_s)
        return [o if o.task_id not in self.lost else ReportOutcome(task_id=o.task_id, status_code=409, detail="stale")
                for o in out]


@pytest.mark.parametrize("batches", [True, False])
def test_a_lease_calls_processing_reports_go_in_one_call_and_a_lost_lease_is_not_run(batches):
    client = RefusingClient({"b"}, batches)
    ledger = Ledger()
    tasks = [task(t) for t in "abc"]
    for t in tasks:
        ledger.hold(t, Stage.ADMIT)
    may_run = Reporter(client, lambda: "w-1", ledger, deadline_s=1.0).processing_all(tasks)
    assert [t.id for t in may_run] == ["a", "c"]
    assert client.reports == [("a", "processing"), ("b", "processing"), ("c", "processing")]
    assert client.calls == ([3] if batches else [1, 1, 1])
    assert [h.task.id for h in ledger.held()] == ["a", "c"]  # b's renewal ended: it never runs
    assert ledger.fate(tasks[1]) is Fate.DONE and ledger.counters.as_wire()["leases_lost"] == 1


def test_processing_reports_that_cannot_be_delivered_together_are_not_sent_again_one_by_one():
    from worker.serving.queue_client import Unavailable

    class DownClient(RecordingClient):
        def report_many(self, reports, deadline_s):
            self.calls.append(len(reports))
            raise Unavailable("POST /v1/reports: ConnectError")  # after its retries, within the deadline

    client, ledger = DownClient(), Ledger()
    tasks = [task(t) for t in "ab"]
    for t in tasks:
        ledger.hold(t, Stage.ADMIT)
    assert Reporter(client, lambda: "w-1", ledger, deadline_s=1.0).processing_all(tasks) == []
    assert client.calls == [2] and client.reports == [] and ledger.held() == []


def test_a_cancelled_task_is_reported_cancelled_and_its_stored_result_removed():
    client, ledger, removed = RecordingClient(), Ledger(), []
    reporter = Reporter(client, lambda: "w-1", ledger, deadline_s=1.0, discard=lambda t, r: removed.append(r.uri))
    stored, waiting = task("a"), task("b")
    for t in (stored, waiting):
        ledger.hold(t, Stage.GENERATE)
    assert ledger.mark_cancelled(["a", "b", "unknown"]) == ["a", "b"]
    assert ledger.cancelled(stored) and not ledger.dropped(stored)  # dropped, but reported `cancelled`
    assert not ledger.cancelled(task("a")) and ledger.dropped(task("a"))  # another attempt of a
    result = TaskResult(uri="file:///a.png", content_type="image/png", width=1, height=1, seed=1, bytes=1, sha256="0")
    reporter.finals([(stored, result)])
    reporter.cancelled(waiting, "before it started")
    assert removed == ["file:///a.png"]  # the image stored before the worker learned it
    assert client.reports == [("a", "failed"), ("b", "failed")]
    assert ledger.held() == []


def test_a_success_refused_because_the_task_was_cancelled_removes_the_object():
    ledger, removed = Ledger(), []
    client = RecordingClient()
    client.report_many = lambda reports, deadline_s: [ReportOutcome(
        task_id=r.task_id, status_code=409, detail=f"task {r.task_id} was cancelled by a client; its succeeded "
        "report is refused") if r.task_id == "a" else ReportOutcome(task_id=r.task_id, status_code=409,
                                                                     detail="not held by this token")
        for r in reports]
    reporter = backlog_of(client, ledger, discard=lambda t, r: removed.append(t.id))
    pool = ThreadPoolExecutor(1)
    futures = []
    for t in ("a", "b"):  # b: a stale lease; its object belongs to the newer attempt and stays
        futures.append(pool.submit(lambda t=t: TaskResult(uri=f"file:///{t}.png", content_type="image/png",
                                                          width=1, height=1, seed=1, bytes=1, sha256="0")))
        reporter.add(task(t), futures[-1])
    for f in futures:  # both finished: reported together
        f.result(5)
    reporter.report_down_to(0, keepalive=lambda: None, every_s=0.05)
    assert removed == ["a"]
    counters = ledger.counters.as_wire()
    assert counters["tasks_cancelled"] == 1 and counters["leases_lost"] == 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowClient(RecordingClient):
    """Holds every report call until `answer` is set; or raises `error`."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.answer, self.entered, self.error = threading.Event(), threading.Event(), error

    def _hold(self) -> None:
        self.entered.set()
        if self.error is not None:
            raise self.error
        assert self.answer.wait(10)

    def report(self, task_id, rep, deadline_s):
        self._hold()
        return super().report(task_id, rep, deadline_s)

    def report_many(self, reports, deadline_s):
        self._hold()
        return super().report_many(reports, deadline_s)


def test_the_serve_loop_does_not_wait_for_a_report_call_within_its_limit():
    """Reports go out on the sender's thread: the next round starts while the call is on its way,
    and the task counts as unreported until it is answered."""
    client = SlowClient()
    backlog = backlog_of(client)
    post = GatedPost("a")
    post.gates["a"].set()
    backlog.add(task("a"), post.submit(task("a")))
    backlog._pending[0][1].result(5)
    backlog.report_down_to(1, keepalive=lambda: None, every_s=0.05)  # returns with the call in flight
    assert client.entered.wait(5) and client.reports == [] and len(backlog) == 1
    threading.Timer(0.2, client.answer.set).start()
    keepalives = []
    backlog.report_down_to(0, keepalive=lambda: keepalives.append(1), every_s=0.05)
    assert client.reports == [("a", "succeeded")] and len(backlog) == 0 and keepalives


def test_an_error_in_sending_reaches_the_serve_loop():
    class Refused(Exception):
        pass

    backlog = backlog_of(SlowClient(Refused("this worker is not registered")))
    post = GatedPost("a")
    post.gates["a"].set()
    backlog.add(task("a"), post.submit(task("a")))
    with pytest.raises(Refused, match="not registered"):
        backlog.report_down_to(0, keepalive=lambda: None, every_s=0.05)
