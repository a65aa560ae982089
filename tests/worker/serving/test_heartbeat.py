"""The heartbeat thread against a real scheduler: it renews leases and notices lost ones. Waits are
on conditions (beats sent, statuses seen), each with a deadline, not on fixed sleeps."""

import httpx
import pytest

from launch.local import free_port, start_scheduler, wait_until
from protocol import DeviceInfo, RegisterWorker
from worker.config import DeadlinesConfig, QueueConfig
from worker.serving.heartbeat import HeartbeatThread
from worker.serving.ledger import Fate, Ledger, Stage, stage_limits
from worker.serving.queue_client import QueueClient
from worker.serving.state import WorkerState
from worker.serving.task import Task

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

LEASE_TTL_S = 1.0


@pytest.fixture
def queue(tmp_path):
    port = free_port()
    proc = start_scheduler(tmp_path / "s.db", port, tmp_path / "s.log", lease_ttl=LEASE_TTL_S)
    url = f"http://127.0.0.1:{port}"
    client = QueueClient(QueueConfig(url=url, timeout_s=2.0), token=None)
    yield url, client
    client.close()
    proc.stop()


def register(client) -> str:
    info = RegisterWorker(hostname="h", world_size=1, devices=[DeviceInfo(name="cpu", memory_bytes=1)],
                          model="m", version="v")
    return client.register(info, deadline_s=5).worker_id


def status_of(url: str, task_id: str) -> str:
    return httpx.get(f"{url}/v1/tasks/{task_id}").json()["status"]


def held_task(url, client, ledger: Ledger, stage: Stage) -> tuple[str, dict]:
    """A registered worker holding a lease on a fresh task, in `stage`."""
    wid = register(client)
    task = httpx.post(f"{url}/v1/tasks", json={"input": {"prompt": "x"}}).json()
    lease, = client.lease(wid, 1, 0)
    ledger.hold(Task(lease), stage)
    return wid, task


def test_heartbeat_keeps_a_lease_alive_and_reports_status(queue):
    url, client = queue
    state, ledger = WorkerState(safety_policy="2026.11.1"), Ledger(stage_limits(DeadlinesConfig(generate_s=60)))
    wid, task = held_task(url, client, ledger, Stage.GENERATE)
    state.set_status("ready")
    hb = HeartbeatThread(client, wid, state, ledger, interval_s=0.3)
    hb.start()
    # Eight beats take about 2.4 s: more than twice the lease ttl, renewed all along.
    wait_until(lambda: hb.beats >= 8, 10, "eight heartbeats")
    assert status_of(url, task["id"]) == "leased"
    workers = httpx.get(f"{url}/v1/workers").json()
    assert workers[0]["status"] == "ready" and workers[0]["in_flight"] == [task["id"]]
    assert workers[0]["safety_policy"] == "2026.11.1"  # which lists its refusals came from
    hb.stop()
    hb.join(5)
    wait_until(lambda: status_of(url, task["id"]) == "queued", 10, "the lease to expire without heartbeats")


def test_status_change_is_sent_at_once(queue):
    url, client = queue
    wid = register(client)
    state = WorkerState()
    hb = HeartbeatThread(client, wid, state, Ledger(), interval_s=60)
    hb.start()
    wait_until(lambda: hb.beats >= 1, 10, "the first heartbeat")
    state.set_status("ready")
    # Well before the 60 s interval: the change itself wakes the thread.
    wait_until(lambda: httpx.get(f"{url}/v1/workers").json()[0]["status"] == "ready", 5, "status ready")
    hb.stop()


def test_lost_lease_is_marked(queue):
    url, client = queue
    wid, other = register(client), register(client)
    httpx.post(f"{url}/v1/tasks", json={"input": {"prompt": "x"}})
    lease, = client.lease(wid, 1, 0)
    # The lease expires (ttl 1 s) and the task goes to another worker.
    wait_until(lambda: client.lease(other, 1, 0), 10, "the expired task to be leased again")
    ledger = Ledger(stage_limits(DeadlinesConfig(generate_s=60)))
    task = Task(lease)
    ledger.hold(task, Stage.GENERATE)
    HeartbeatThread(client, wid, WorkerState(), ledger, interval_s=60).beat()
    assert ledger.fate(task) is Fate.LOST and ledger.dropped(task)
    assert ledger.counters.as_wire()["leases_lost"] == 1


def test_unknown_worker_asks_for_registration(queue):
    _, client = queue
    state = WorkerState()
    HeartbeatThread(client, "w-nobody", state, Ledger(), interval_s=60).beat()
    assert state.take_forgotten("w-nobody")


def test_a_task_past_its_stage_deadline_is_no_longer_renewed(queue):
    url, client = queue
    clock = FakeClock()
    ledger = Ledger(stage_limits(DeadlinesConfig(store_s=30)), clock=clock)
    wid, task = held_task(url, client, ledger, Stage.STORE)
    hb = HeartbeatThread(client, wid, WorkerState(clock=clock), ledger, interval_s=0.2)
    hb.start()
    wait_until(lambda: hb.beats >= 3, 10, "three heartbeats")
    assert status_of(url, task["id"]) == "leased"  # renewed past its 1 s TTL while the store moves
    clock.now += 31  # the store hangs past its deadline
    assert ledger.in_flight() == [] and hb.message().in_flight == []
    wait_until(lambda: status_of(url, task["id"]) == "queued", 10, "the lease to expire, no longer renewed")
    hb.stop()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
