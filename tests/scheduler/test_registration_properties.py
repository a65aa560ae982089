"""Property-based (hypothesis): any interleaving of registrations (nodes registering again), heartbeats
of any status a worker may report, silences past the liveness time and sweeps moves each registration
only along the lifecycle's table (lifecycle.REGISTRATION_TRANSITIONS); a replaced registration never
changes again, and a drained one is refused."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import Heartbeat, RegistrationStatus
from scheduler.store import SQLiteStore, Unknown
from scheduler.store.lifecycle import REGISTERED, REGISTRATION_TRANSITIONS
from tests.harness import Clock
from tests.scheduler.test_store import worker

R = RegistrationStatus
ACTIONS = st.lists(st.tuples(
    st.sampled_from(["register", "initializing", "ready", "draining", "drained", "silence"]),
    st.integers(0, 5)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS)
def test_every_registration_moves_only_along_its_lifecycle(tmp_path_factory, actions):
    clock = Clock()
    store = SQLiteStore(tmp_path_factory.mktemp("prop") / "s.db", clock=clock, liveness_s=5.0)
    try:
        run(store, clock, actions)
    finally:
        store.close()


def run(store, clock, actions) -> None:
    ids: list[str] = []
    seen: dict[str, str] = {}  # each registration's status at the last check
    for action, k in actions:
        if action == "register":  # on one of two nodes: a second registration replaces the first
            ids.append(worker(store, node_id=f"n{k % 2}"))
        elif action == "silence":
            clock.now += 6
            store.upkeep.sweep()
        elif ids:
            worker_id = ids[k % len(ids)]
            try:
                store.workers.heartbeat(worker_id, Heartbeat(status=action, timestamp=clock.now))
            except Unknown:
                assert seen[worker_id] == R.DRAINED, f"{worker_id} refused while {seen[worker_id]}"
        check(store, ids, seen)


def check(store, ids, seen) -> None:
    statuses = {w.id: w.status for w in store.workers.workers()}
    for worker_id in ids:
        status = statuses[worker_id]
        before = seen.setdefault(worker_id, REGISTERED)
        assert status == before or status in REGISTRATION_TRANSITIONS[before], f"{worker_id} went {before} -> {status}"
        seen[worker_id] = status
