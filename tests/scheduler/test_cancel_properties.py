"""Property-based (hypothesis): any interleaving of submits, claims, reports (fresh or stale
tokens), cancels, lease expiry and worker restarts leaves no task in two final states, changes no
final task, never hands a cancelled task out again, and never makes a cancelled task succeed; and
every status change seen is one the store's lifecycle lists (lifecycle.TRANSITIONS)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import FINAL_STATUSES, Report, SubmitTask
from scheduler.store import Refused, SQLiteStore, Unknown
from scheduler.store.lifecycle import INITIAL, TRANSITIONS
from tests.harness import Clock
from tests.scheduler.test_store import fail, ok, worker

ACTIONS = st.lists(st.tuples(
    st.sampled_from(["submit", "claim", "processing", "succeeded", "failed", "released", "cancel", "expire",
                     "restart"]),
    st.integers(0, 5)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS)
def test_no_task_ends_twice_and_a_cancelled_task_never_runs_or_succeeds(tmp_path_factory, actions):
    clock = Clock()
    store = SQLiteStore(tmp_path_factory.mktemp("prop") / "s.db", clock=clock, lease_ttl_s=10.0, max_attempts=3)
    try:
        run(store, clock, actions)
    finally:
        store.close()


def run(store, clock, actions) -> None:
    node = worker(store, node_id="n1")
    ids: list[str] = []
    leases: dict[str, list] = {}  # every lease ever granted per task (old tokens stay usable as stale ones)
    final: dict[str, str] = {}  # the first final status seen
    cancelled_at: dict[str, float] = {}
    seen: dict[str, str] = {}  # each task's status at the last check
    for action, k in actions:
        task_id = ids[k % len(ids)] if ids else None
        if action == "submit":
            ids.append(store.tasks.submit(SubmitTask(input={"prompt": f"p{len(ids)}"}))[0].id)
        elif action == "claim":
            for lease in store.claims.claim(node, 1 + k % 3):
                assert lease.task_id not in cancelled_at, "a cancelled task was leased again"
                leases.setdefault(lease.task_id, []).append((node, lease.lease_token))
        elif action == "cancel" and task_id:
            try:
                view = store.reports.cancel(task_id)
            except Refused:
                assert store.tasks.get(task_id).status in FINAL_STATUSES
            else:
                cancelled_at[task_id] = clock.now
                assert view.status in ("cancelled", "leased", "processing")
        elif action == "expire":
            clock.now += 11
            store.upkeep.sweep()
        elif action == "restart":  # the node's group restarts: what it held is requeued or ended
            node = worker(store, node_id="n1")
        elif task_id and leases.get(task_id):
            wid, token = leases[task_id][-1 if k % 2 else 0]  # the newest lease, or the first (maybe stale)
            if action == "succeeded":
                report = ok(token, wid)
            elif action == "failed":
                report = fail(token, wid, k % 2 == 0)
            else:
                report = Report(worker_id=wid, lease_token=token, status=action)
            try:
                store.reports.report(task_id, report)
            except (Refused, Unknown):
                pass
        check(store, ids, final, cancelled_at, seen)


def check(store, ids, final, cancelled_at, seen) -> None:
    for task_id in ids:
        status = store.tasks.get(task_id).status
        before = seen.setdefault(task_id, INITIAL)
        assert status == before or status in TRANSITIONS[before], f"{task_id} went {before} -> {status}"
        seen[task_id] = status
        if task_id in final:
            assert status == final[task_id], f"{task_id} ended {final[task_id]}, then became {status}"
        elif status in FINAL_STATUSES:
            final[task_id] = status
        if task_id in cancelled_at:
            assert status != "succeeded" and status != "queued", f"cancelled {task_id} is {status}"
