"""The store's rules, with a fake clock so lease expiry needs no sleeping, on both backends: SQLite
and a real PostgreSQL server (tests/scheduler/conftest.py)."""

import logging
import threading

import pytest

from protocol import ErrorEnvelope, Heartbeat, RegisterWorker, Report, SubmitTask, TaskResult, WorkerLimits
from scheduler.store import Refused, Unknown


@pytest.fixture
def store(make_store):
    return make_store(lease_ttl_s=10.0, max_attempts=2)


def worker(store, node_id: str | None = None, limits: WorkerLimits | None = None) -> str:
    return store.workers.register(RegisterWorker(hostname="h", world_size=2, devices=[], model="m", version="v",
                                                 node_id=node_id, limits=limits))[0]


def limits(max_side: int = 1024) -> WorkerLimits:
    return WorkerLimits(max_prompt_chars=2000, min_side=64, max_side=max_side, max_pixels=max_side * max_side,
                        default_width=256, default_height=256, max_steps=8, output_formats=["png"])


def submit(store, prompt="p", **kw):
    return store.tasks.submit(SubmitTask(input={"prompt": prompt}, **kw))[0]


def ok(token, wid):
    return Report(worker_id=wid, lease_token=token, status="succeeded",
                  result=TaskResult(uri="u", content_type="image/png", width=1, height=1, seed=1, bytes=1,
                                    sha256="s"))


def fail(token, wid, retryable):
    return Report(worker_id=wid, lease_token=token, status="failed",
                  error=ErrorEnvelope(code="boom", message="it broke", retryable=retryable))


def test_claim_by_priority_then_fifo(store):
    w = worker(store)
    a, b, c = submit(store, "a"), submit(store, "b", priority=5), submit(store, "c")
    got = [lease.task_id for lease in store.claims.claim(w, 3)]
    assert got == [b.id, a.id, c.id]
    assert store.claims.claim(w, 3) == []


def test_claim_sets_token_deadline_and_attempt(store, clock):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    assert lease.attempt == 1 and lease.lease_deadline == clock.now + 10.0 and lease.lease_token
    view = store.tasks.get(t.id)
    assert view.status == "leased" and view.worker_id == w and view.attempts == 1


def test_concurrent_claims_never_hand_out_a_task_twice(store):
    for i in range(60):
        submit(store, str(i))
    workers = [worker(store) for _ in range(6)]
    claimed: list[str] = []
    lock = threading.Lock()

    def run(w):
        while got := store.claims.claim(w, 4):
            with lock:
                claimed.extend(lease.task_id for lease in got)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 60 == len(set(claimed))


def test_a_lease_is_held_up_to_and_including_its_deadline(store, clock):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    clock.now = lease.lease_deadline
    assert store.upkeep.sweep() == 0 and store.tasks.get(t.id).status == "leased"
    clock.now += 0.001
    assert store.upkeep.sweep() == 1 and store.tasks.get(t.id).status == "queued"


def test_expired_lease_requeues_then_fails_when_attempts_are_used(store, clock):
    w = worker(store)
    t = submit(store)
    store.claims.claim(w, 1)
    clock.now += 10.5
    assert store.tasks.get(t.id).status == "leased"  # expiry is maintenance's job, not a read's
    store.upkeep.sweep()
    assert store.tasks.get(t.id).status == "queued"
    store.claims.claim(w, 1)
    clock.now += 10.5
    store.upkeep.sweep()
    view = store.tasks.get(t.id)
    assert view.status == "failed" and view.attempts == 2
    assert view.error.code == "lease_expired" and "attempt 2 of 2" in view.error.message


def test_stale_token_is_refused_and_changes_nothing(store, clock):
    w1, w2 = worker(store), worker(store)
    t = submit(store)
    first, = store.claims.claim(w1, 1)
    clock.now += 11
    with pytest.raises(Refused):  # past its deadline, even before the sweep
        store.reports.report(t.id, ok(first.lease_token, w1))
    store.upkeep.sweep()
    second, = store.claims.claim(w2, 1)
    with pytest.raises(Refused):
        store.reports.report(t.id, ok(first.lease_token, w1))
    assert store.tasks.get(t.id).status == "leased"
    assert store.reports.report(t.id, ok(second.lease_token, w2)).status == "succeeded"


def test_report_after_success_is_refused(store):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    store.reports.report(t.id, ok(lease.lease_token, w))
    with pytest.raises(Refused):
        store.reports.report(t.id, fail(lease.lease_token, w, retryable=True))
    assert store.tasks.get(t.id).status == "succeeded"


def test_token_of_another_worker_is_refused(store):
    w1, w2 = worker(store), worker(store)
    t = submit(store)
    lease, = store.claims.claim(w1, 1)
    with pytest.raises(Refused):
        store.reports.report(t.id, ok(lease.lease_token, w2))


def test_retryable_failure_requeues_with_last_error(store):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    view = store.reports.report(t.id, fail(lease.lease_token, w, retryable=True))
    assert view.status == "queued" and view.error.code == "boom" and view.error.worker_id == w
    lease, = store.claims.claim(w, 1)
    view = store.reports.report(t.id, fail(lease.lease_token, w, retryable=True))
    assert view.status == "failed" and view.attempts == 2  # capped


def test_non_retryable_failure_is_final(store):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    assert store.reports.report(t.id, fail(lease.lease_token, w, retryable=False)).status == "failed"


def test_processing_and_heartbeat_renew_the_lease(store, clock):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    clock.now += 8
    store.reports.report(t.id, Report(worker_id=w, lease_token=lease.lease_token, status="processing"))
    clock.now += 8
    reply = store.workers.heartbeat(w, Heartbeat(status="ready", in_flight=[t.id, "gone"], timestamp=0))
    assert reply.renewed == {t.id: clock.now + 10} and reply.lost == ["gone"]
    clock.now += 8
    assert store.tasks.get(t.id).status == "processing"  # 24 s after the claim, lease ttl 10 s


def test_heartbeat_reports_a_lease_taken_over_as_lost(store, clock):
    w1, w2 = worker(store), worker(store)
    t = submit(store)
    store.claims.claim(w1, 1)
    clock.now += 11
    store.upkeep.sweep()
    store.claims.claim(w2, 1)
    assert store.workers.heartbeat(w1, Heartbeat(status="ready", in_flight=[t.id], timestamp=0)).lost == [t.id]


def test_unknown_worker_and_task(store):
    with pytest.raises(Unknown):
        store.claims.claim("w-nobody", 1)
    with pytest.raises(Unknown):
        store.tasks.get("nope")


def test_idempotency_key_replays_and_conflicts(store):
    a = submit(store, "x", idempotency_key="k1")
    again, created = store.tasks.submit(SubmitTask(input={"prompt": "x"}, idempotency_key="k1"))
    assert again.id == a.id and not created
    with pytest.raises(Refused):
        store.tasks.submit(SubmitTask(input={"prompt": "other"}, idempotency_key="k1"))


def test_two_submits_racing_with_one_key_make_one_task_and_the_later_replays_it(store):
    """The later one's INSERT yields to the key the earlier one took between its steps."""
    req = SubmitTask(input={"prompt": "x"}, idempotency_key="race")
    plan = store.tasks._submit(req, store.clock())
    insert = next(plan)  # the later submit's INSERT, not yet sent
    first, created = store.tasks.submit(req)  # the earlier one lands meanwhile
    assert created
    try:
        plan.send(store._step(plan.send(store._step(insert))))
    except StopIteration as done:
        view, created = done.value
    assert (view.id, created) == (first.id, False)
    assert store.tasks.queued_count() == 1


def test_state_survives_reopening(make_store):
    s = make_store()
    t = s.tasks.submit(SubmitTask(input={"prompt": "p"}))[0]
    s.close()
    s2 = make_store(location=s.location)  # PostgreSQL: the migrations are not applied twice
    assert s2.tasks.get(t.id).status == "queued"


def test_heartbeat_records_warnings_and_counters(store):
    wid = worker(store)
    store.workers.heartbeat(wid, Heartbeat(status="ready", timestamp=1.0, warnings=["safety.image off"],
                                           counters={"images_generated": 3}))
    w = store.workers.workers()[0]
    assert w.warnings == ["safety.image off"] and w.counters == {"images_generated": 3}
    assert w.safety_policy is None  # a worker from before the policy lists sends none


def test_heartbeat_records_the_prompt_policy_version(store):
    wid = worker(store)
    store.workers.heartbeat(wid, Heartbeat(status="ready", timestamp=1.0, safety_policy="2026.11.1+local.ab12cd34"))
    assert store.workers.workers()[0].safety_policy == "2026.11.1+local.ab12cd34"


def test_error_details_are_kept(store):
    wid = worker(store)
    t = submit(store)
    lease = store.claims.claim(wid, 1)[0]
    err = ErrorEnvelope(code="unsafe_prompt", message="m", retryable=False, details={"category": "insult"})
    store.reports.report(t.id, Report(worker_id=wid, lease_token=lease.lease_token, status="failed", error=err))
    assert store.tasks.get(t.id).error.details == {"category": "insult"}


def test_a_released_task_is_requeued_and_its_attempt_does_not_count(store):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    store.reports.report(t.id, fail(lease.lease_token, w, retryable=True))  # attempt 1 of 2 really ran
    lease, = store.claims.claim(w, 1)
    view = store.reports.report(t.id, Report(worker_id=w, lease_token=lease.lease_token, status="released"))
    assert view.status == "queued" and view.attempts == 1 and view.error.code == "boom"  # last error kept
    lease, = store.claims.claim(w, 1)
    assert lease.attempt == 2  # a healthy worker still gets its full second attempt
    with pytest.raises(Refused):  # the released token is dead
        store.reports.report(t.id, Report(worker_id=w, lease_token="stale", status="released"))


def test_a_node_registering_again_requeues_what_its_old_group_held_at_once(store, clock):
    old, other = worker(store, "host/run-1"), worker(store, "host/run-2")
    a, b, c = submit(store, "a"), submit(store, "b"), submit(store, "c")
    [la, lb] = store.claims.claim(old, 2)
    store.reports.report(a.id, Report(worker_id=old, lease_token=la.lease_token, status="processing"))
    [lc] = store.claims.claim(other, 1)
    new, requeued = store.workers.register(RegisterWorker(hostname="h", world_size=2, devices=[], model="m",
                                                          version="v", node_id="host/run-1"))
    assert requeued == 2  # long before the lease TTL: the clock has not moved
    for t in (a, b):
        view = store.tasks.get(t.id)
        assert view.status == "queued" and view.attempts == 1 and view.worker_id == old
    assert store.tasks.get(c.id).status == "leased"  # another node's lease is untouched
    views = {w.id: w for w in store.workers.workers()}
    assert views[old].status == "replaced" and views[old].in_flight == [] and views[new].node_id == "host/run-1"
    assert views[other].status == "initializing"
    assert {lease.task_id for lease in store.claims.claim(new, 5)} == {a.id, b.id}
    # The old group's reports are refused: its leases are gone.
    with pytest.raises(Refused):
        store.reports.report(a.id, ok(la.lease_token, old))


def test_a_task_whose_workers_keep_restarting_fails_when_out_of_attempts(store):
    first = worker(store, "n")
    t = submit(store)
    store.claims.claim(first, 1)
    second = worker(store, "n")
    store.claims.claim(second, 1)  # attempt 2 of 2
    worker(store, "n")
    view = store.tasks.get(t.id)
    assert view.status == "failed" and view.error.code == "worker_restarted" and view.error.retryable
    assert "restarted (node n registered again" in view.error.message and "attempt 2 of 2" in view.error.message


def test_a_registration_without_a_node_replaces_nothing(store):
    w = worker(store)
    t = submit(store)
    store.claims.claim(w, 1)
    worker(store)
    assert store.tasks.get(t.id).status == "leased"
    assert [v.status for v in store.workers.workers()] == ["initializing", "initializing"]


def test_a_silent_worker_is_lost_and_its_tasks_requeued_before_the_ttl(make_store, clock):
    s = make_store(lease_ttl_s=60.0, max_attempts=3, liveness_s=5.0, worker_retention_s=100.0)
    quiet, alive = worker(s), worker(s)
    a, b = submit(s, "a"), submit(s, "b")
    s.claims.claim(quiet, 1)
    s.claims.claim(alive, 1)
    clock.now += 4
    s.workers.heartbeat(alive, Heartbeat(status="ready", in_flight=[b.id], timestamp=0))
    assert s.upkeep.sweep() == 0
    clock.now += 2  # quiet: 6 s without a heartbeat; alive: 2 s
    assert s.upkeep.sweep() == 1
    views = {w.id: w for w in s.workers.workers()}
    assert views[quiet].status == "lost" and views[quiet].in_flight == []
    assert views[alive].status == "ready" and views[alive].last_heartbeat_age_s == 2.0
    assert s.tasks.get(a.id).status == "queued" and s.tasks.get(b.id).status == "leased"  # long before the 60 s TTL
    s.workers.heartbeat(quiet, Heartbeat(status="ready", timestamp=0))  # it comes back: shown as it says
    assert {w.id: w for w in s.workers.workers()}[quiet].status == "ready"


def test_lost_and_replaced_registrations_are_pruned_after_the_retention(make_store, clock):
    s = make_store(liveness_s=5.0, worker_retention_s=100.0)
    gone = worker(s, "node-a")
    worker(s, "node-a")  # replaces it
    silent = worker(s)
    clock.now += 50
    s.upkeep.sweep()
    assert {w.id: w.status for w in s.workers.workers()}[silent] == "lost"
    clock.now += 51
    s.upkeep.sweep()
    assert gone not in {w.id for w in s.workers.workers()} and silent not in {w.id for w in s.workers.workers()}


def test_a_rounds_reports_in_one_statement_apply_only_where_the_lease_is_current(store, clock):
    w, other = worker(store), worker(store)
    for i in range(5):
        submit(store, str(i))
    a, b, c = store.claims.claim(w, 3)
    d, e = store.claims.claim(other, 2)
    clock.now += 5.0
    got = store.reports.report_many([(le.task_id, Report(worker_id=w, lease_token=le.lease_token, status="processing"))
                                     for le in (a, b, c)])
    assert [g.status for g in got] == ["processing"] * 3 and got[0].started_at == clock.now
    clock.now += 9.0  # a, b, c renewed by `processing`; d and e expired
    got = store.reports.report_many([(a.task_id, ok(a.lease_token, w)), (b.task_id, ok("stale", w)),
                                     (d.task_id, ok(d.lease_token, other)), (e.task_id, ok(e.lease_token, w)),
                                     ("nosuchtask", ok("t", w)), (c.task_id, ok(c.lease_token, w))])
    assert got[0].status == "succeeded" and got[0].result.uri == "u" and got[5].status == "succeeded"
    assert [type(g) for g in got[1:5]] == [Refused, Refused, Refused, Unknown]
    assert store.tasks.get(b.task_id).status == "processing" and store.tasks.get(d.task_id).status == "leased"
    assert store.tasks.get(a.task_id).started_at == got[0].started_at  # set once, by the first `processing`


def test_reports_of_one_task_in_one_call_apply_in_order(store):
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    got = store.reports.report_many([(t.id, Report(worker_id=w, lease_token=lease.lease_token, status="processing")),
                                     (t.id, ok(lease.lease_token, w)), (t.id, ok(lease.lease_token, w))])
    assert got[0].status == "processing" and got[1].status == "succeeded"
    assert got[2] == got[1]  # the same final report again (a retry): answered as the first, nothing changed
    other = ok(lease.lease_token, w).model_copy(update={"result": ok(lease.lease_token, w).result.model_copy(
        update={"uri": "file:///elsewhere.png"})})
    assert isinstance(store.reports.report_many([(t.id, other)])[0], Refused)  # another result: refused


def test_a_drained_worker_is_never_lost_and_its_registration_takes_no_more_work(make_store, clock):
    s = make_store(liveness_s=5.0, worker_retention_s=100.0)
    gone, crashed = worker(s), worker(s)
    s.workers.heartbeat(gone, Heartbeat(status="draining", timestamp=0))
    reply = s.workers.heartbeat(gone, Heartbeat(status="drained", timestamp=0))
    assert reply.renewed == {} and reply.lost == []
    clock.now += 50  # far past the liveness time: silence is expected from a drained worker
    s.upkeep.sweep()
    assert {w.id: w.status for w in s.workers.workers()} == {gone: "drained", crashed: "lost"}
    assert s.tasks.figures().workers_by_status == {"drained": 1, "lost": 1}
    submit(s)
    for call in (lambda: s.claims.claim(gone, 1),
                 lambda: s.workers.heartbeat(gone, Heartbeat(status="ready", timestamp=0))):
        with pytest.raises(Unknown, match=f"worker {gone} has drained and left; register again"):
            call()
    assert s.tasks.queued_count() == 1  # the refused lease took nothing
    clock.now += 51
    s.upkeep.sweep()
    assert gone not in {w.id for w in s.workers.workers()}  # pruned like lost and replaced registrations


def test_a_drain_that_still_holds_a_task_gives_it_back_at_once(store):
    w = worker(store)
    t = submit(store)
    store.claims.claim(w, 1)
    reply = store.workers.heartbeat(w, Heartbeat(status="drained", in_flight=[t.id], timestamp=0))
    assert reply.lost == [t.id] and reply.renewed == {}
    view = store.tasks.get(t.id)
    assert view.status == "queued" and view.attempts == 1  # the attempt counts, as for a lost worker
    assert store.reclaimed[("worker_drained", "queued")] == 1
    assert {v.id: v.in_flight for v in store.workers.workers()}[w] == []


def test_a_replaced_registration_stays_replaced_when_it_drains(store):
    old = worker(store, "node")
    new = worker(store, "node")
    store.workers.heartbeat(old, Heartbeat(status="drained", timestamp=0))
    assert {v.id: v.status for v in store.workers.workers()} == {old: "replaced", new: "initializing"}


def test_limits_are_kept_per_worker_and_the_fleet_is_those_that_can_take_tasks(make_store, clock):
    s = make_store(liveness_s=5.0)
    small, big, unsaid = worker(s, limits=limits(1024)), worker(s, limits=limits(2048)), worker(s)
    worker(s, limits=limits(1024))  # the same limits again: one entry
    assert {v.id: v.limits for v in s.workers.workers()}[small] == limits(1024)
    assert {v.id: v.limits for v in s.workers.workers()}[unsaid] is None
    assert (sorted(s.workers.fleet_limits(), key=lambda lim: lim.max_side if lim else 0)
            == [None, limits(1024), limits(2048)])
    s.workers.heartbeat(big, Heartbeat(status="draining", timestamp=0))  # takes no new tasks
    s.workers.heartbeat(unsaid, Heartbeat(status="drained", timestamp=0))
    assert s.workers.fleet_limits() == [limits(1024)]
    clock.now += 6
    s.upkeep.sweep()  # every one of them lost
    assert s.workers.fleet_limits() == []


def test_taking_back_held_tasks_and_losing_a_worker_are_logged(make_store, clock, caplog):
    caplog.set_level(logging.WARNING, "scheduler.store.reclaim")
    s = make_store(lease_ttl_s=10.0, max_attempts=1, liveness_s=30.0)
    w = worker(s)
    t = submit(s)
    s.claims.claim(w, 1)
    clock.now += 11
    s.workers.heartbeat(w, Heartbeat(status="ready", timestamp=0))  # alive, but the lease is gone
    assert s.upkeep.sweep() == 1
    [expired] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert expired.getMessage() == f"task {t.id} failed for good: lease_expired (worker {w}, attempt 1 of 1)"
    assert (expired.task_id, expired.worker_id, expired.attempt) == (t.id, w, 1)
    caplog.clear()
    s = make_store(lease_ttl_s=60.0, max_attempts=3, liveness_s=5.0)
    quiet = worker(s)
    held = submit(s)
    s.claims.claim(quiet, 1)
    clock.now += 7
    assert s.upkeep.sweep() == 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [f"task {held.id} requeued: worker_lost (worker {quiet}, attempt 1 of 3)",
                    f"worker {quiet} (h) lost: no heartbeat for 7s; 1 held task(s) requeued, 0 failed for good"]


SCENES = ["held", "cancel asked", "stale token", "lease expired", "already succeeded", "other worker"]


def scene(store, clock, what: str):
    """A task leased, in one of SCENES; its id, the worker's note and result for it, and what the
    store's row then is (to compare)."""
    w = worker(store)
    t = submit(store)
    lease, = store.claims.claim(w, 1)
    token = lease.lease_token
    clock.now += 1.0
    if what == "cancel asked":
        store.reports.cancel(t.id)
    elif what == "stale token":
        token = "stale"
    elif what == "lease expired":
        clock.now += 11.0
    elif what == "already succeeded":
        store.reports.report(t.id, ok(token, w))
    elif what == "other worker":
        w = worker(store)
    note = Report(worker_id=w, lease_token=token, status="processing", at=clock() - 0.5)
    return t.id, note, ok(token, w)


def essence(out):
    """An outcome as a caller reads it: an error's kind, or the task's status."""
    return type(out).__name__ if isinstance(out, Exception) else out.status


def row_of(store, task_id):
    t = store.tasks.get(task_id)
    return (t.status, t.started_at, t.result, t.error.code if t.error else None, t.finished_at is not None)


@pytest.mark.parametrize("what", SCENES)
def test_a_note_and_result_of_one_task_as_one_update_end_as_each_on_its_own(make_store, clock, what):
    # Without views (an exchange's reports), a task's processing note and its succeeded report are
    # one UPDATE; whatever the task's state, the outcomes and the row are those of each alone.
    one, each = make_store(lease_ttl_s=10.0), make_store(lease_ttl_s=10.0)
    a = scene(one, clock, what)
    b = scene(each, clock, what)
    tried = []
    real = one.reports._changes.started_succeeded
    one.reports._changes.started_succeeded = lambda *args: (tried.append(args[0]), real(*args))[1]
    merged = one.reports.report_many([(a[0], a[1]), (a[0], a[2])], views=False)
    assert tried == [a[0]]  # the one UPDATE was tried (refused, each then applied alone)
    alone = [each.reports.report_many([(b[0], b[1])])[0], each.reports.report_many([(b[0], b[2])])[0]]
    assert [essence(o) for o in merged] == [essence(o) for o in alone]
    assert row_of(one, a[0])[0] == row_of(each, b[0])[0]
    if what == "held":
        assert [essence(o) for o in merged] == ["processing", "succeeded"]
        status, started_at, result, _, finished = row_of(one, a[0])
        assert started_at == a[1].at and result is not None and finished  # the worker's start, kept


def test_an_exchanges_mixed_reports_end_as_each_on_its_own(make_store, clock):
    # Notes of tasks just started, results alone, and a task's note with its result, each task in
    # one of SCENES: sent together (one statement per kind), outcomes and rows as if sent one by one.
    one, each = make_store(lease_ttl_s=10.0), make_store(lease_ttl_s=10.0)

    def batch(store):
        items = []
        for i, what in enumerate(sorted(SCENES, key=lambda w: w != "lease expired")):  # its wait first
            task_id, note, result = scene(store, clock, what)
            items += [[(task_id, note)], [(task_id, result)], [(task_id, note), (task_id, result)]][i % 3]
        return items

    mine = batch(one)  # made and sent before the other store's (their clock is one)
    assert len({t for t, _ in mine}) == len(SCENES)
    together = one.reports.report_many(mine, views=False)
    theirs = batch(each)
    alone = [each.reports.report_many([item])[0] for item in theirs]
    assert [essence(o) for o in together] == [essence(o) for o in alone]
    assert [row_of(one, t)[0] for t, _ in mine] == [row_of(each, t)[0] for t, _ in theirs]
