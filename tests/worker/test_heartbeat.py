"""The heartbeat thread against a real scheduler: it renews leases and notices lost ones."""

import time

import httpx
import pytest

from launch.local import free_port, start_scheduler
from scheduler.protocol import DeviceInfo, RegisterWorker
from worker.config import QueueConfig
from worker.heartbeat import HeartbeatThread, WorkerState
from worker.queue_client import QueueClient


@pytest.fixture
def queue(tmp_path):
    port = free_port()
    proc = start_scheduler(tmp_path / "s.db", port, tmp_path / "s.log", lease_ttl=1.0)
    url = f"http://127.0.0.1:{port}"
    client = QueueClient(QueueConfig(url=url, timeout_s=2.0), token=None)
    yield url, client
    client.close()
    proc.stop()


def register(client) -> str:
    info = RegisterWorker(hostname="h", world_size=1, devices=[DeviceInfo(name="cpu", memory_bytes=1)],
                          model="m", version="v")
    return client.register(info, deadline_s=5).worker_id


def test_heartbeat_keeps_a_lease_alive_and_reports_status(queue):
    url, client = queue
    wid = register(client)
    task = httpx.post(f"{url}/v1/tasks", json={"input": {"prompt": "x"}}).json()
    lease, = client.lease(wid, 1, 0)
    state = WorkerState()
    state.begin(lease.task_id)
    state.set_status("occupied")
    hb = HeartbeatThread(client, wid, state, interval_s=0.3)
    hb.start()
    time.sleep(2.5)  # more than twice the 1 s lease ttl
    assert httpx.get(f"{url}/v1/tasks/{task['id']}").json()["status"] == "leased"
    workers = httpx.get(f"{url}/v1/workers").json()
    assert workers[0]["status"] == "occupied" and workers[0]["in_flight"] == [task["id"]]
    hb.stop()
    hb.join(5)
    time.sleep(1.6)
    assert httpx.get(f"{url}/v1/tasks/{task['id']}").json()["status"] == "queued"
    assert hb.beats >= 5


def test_status_change_is_sent_at_once(queue):
    url, client = queue
    wid = register(client)
    state = WorkerState()
    hb = HeartbeatThread(client, wid, state, interval_s=60)
    hb.start()
    time.sleep(0.5)
    state.set_status("ready")
    time.sleep(0.5)
    assert httpx.get(f"{url}/v1/workers").json()[0]["status"] == "ready"
    hb.stop()


def test_lost_lease_is_marked(queue):
    url, client = queue
    wid, other = register(client), register(client)
    httpx.post(f"{url}/v1/tasks", json={"input": {"prompt": "x"}})
    lease, = client.lease(wid, 1, 0)
    time.sleep(1.6)
    assert client.lease(other, 1, 2)  # the expired task went to another worker
    state = WorkerState()
    state.begin(lease.task_id)
    HeartbeatThread(client, wid, state, interval_s=60).beat()
    assert state.is_lost(lease.task_id)


def test_unknown_worker_asks_for_registration(queue):
    _, client = queue
    state = WorkerState()
    HeartbeatThread(client, "w-nobody", state, interval_s=60).beat()
    assert state.worker_unknown.is_set()
