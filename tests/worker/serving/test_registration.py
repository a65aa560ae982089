"""The registration against a real scheduler: it advertises the worker's limits, and at the end of a
clean drain says `drained`, which the scheduler keeps (never `lost`) and closes to further leases.
Waits are on what the scheduler shows, each with a deadline, not on fixed sleeps."""

from __future__ import annotations

import httpx
import pytest

from launch.local import free_port, start_scheduler, wait_until
from protocol import DeviceInfo
from worker.config import LimitsConfig, QueueConfig
from worker.serving.ledger import Ledger
from worker.serving.queue_client import NotFound, QueueClient
from worker.serving.registration import Registration
from worker.serving.state import WorkerState
from worker.serving.validation import advertised

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

LIMITS = LimitsConfig(max_side=1024, max_pixels=1024 * 1024, default_width=256, default_height=256)
DEVICES = [DeviceInfo(name="cpu", memory_bytes=1)]


@pytest.fixture
def queue(tmp_path):
    port = free_port()
    proc = start_scheduler(tmp_path / "s.db", port, tmp_path / "s.log", extra=["--store-liveness-s", "1"])
    url = f"http://127.0.0.1:{port}"
    client = QueueClient(QueueConfig(url=url, timeout_s=2.0), token=None)
    yield url, client
    client.close()
    proc.stop()


def statuses(url: str) -> dict[str, str]:
    return {w["id"]: w["status"] for w in httpx.get(f"{url}/v1/workers").json()}


def test_the_registration_advertises_the_limits_validation_applies(queue):
    url, client = queue
    reg = Registration(client, WorkerState(), Ledger(), 0.2, world_size=1, model="m", limits=advertised(LIMITS))
    reg.register(DEVICES)
    try:
        [view] = httpx.get(f"{url}/v1/workers").json()
        assert view["limits"] == advertised(LIMITS).model_dump()
        refused = httpx.post(f"{url}/v1/tasks", json={"input": {"prompt": "x", "width": 1360}})
        assert refused.status_code == 422
        assert refused.json()["detail"] == "input.width: 1360 is above every live worker's limit (1024)"
    finally:
        reg.close()


def test_leaving_after_a_drain_is_shown_drained_never_lost(queue):
    url, client = queue
    state = WorkerState()
    state.set_status("ready")
    reg = Registration(client, state, Ledger(), 0.2, world_size=1, model="m", limits=advertised(LIMITS))
    reg.register(DEVICES)
    wait_until(lambda: statuses(url).get(reg.worker_id) == "ready", 10, "the worker ready")
    state.set_status("draining")
    assert reg.leave()
    assert statuses(url)[reg.worker_id] == "drained"
    assert reg.leave()  # said again (a retry whose first answer was lost): refused, and still not lost
    with pytest.raises(NotFound, match="has drained"):
        client.lease(reg.worker_id, 1, 0)  # the registration takes no more work
    # A worker that stops beating without a word is lost after the liveness time (1 s); the
    # drained one, silent as long, is not.
    silent = Registration(client, WorkerState(), Ledger(), 60, world_size=1, model="m")
    silent.register(DEVICES)
    silent.close()
    wait_until(lambda: statuses(url)[silent.worker_id] == "lost", 15, "the silent worker lost")
    assert statuses(url)[reg.worker_id] == "drained"



def test_only_an_unknown_answer_for_the_current_registration_registers_again(queue):
    # A heartbeat or lease sent under an earlier registration can be answered "unknown worker" after the
    # worker registered again: registering once more for it left a second registration nothing used.
    url, client = queue
    state = WorkerState()
    reg = Registration(client, state, Ledger(), 60, world_size=1, model="m", limits=advertised(LIMITS))
    reg.register(DEVICES)
    try:
        first = reg.worker_id
        state.forgotten(first)
        reg.ensure()
        second = reg.worker_id
        assert second != first
        state.forgotten(first)  # the late answer to a call made as the first registration
        reg.ensure()
        assert reg.worker_id == second and set(statuses(url)) == {first, second}
    finally:
        reg.close()
