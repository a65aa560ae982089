"""A clean drain that cannot tell the scheduler it drained: the worker leaves anyway, and the
scheduler treats its silence as it would a crash's."""

from __future__ import annotations

import pytest

from launch.local import free_port, start_scheduler
from tests.worker.serving.test_registration import DEVICES
from worker.config import QueueConfig
from worker.serving.ledger import Ledger
from worker.serving.queue_client import QueueClient
from worker.serving.registration import Registration
from worker.serving.state import WorkerState

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def test_leaving_while_the_scheduler_is_down_says_it_could_not_tell(tmp_path, caplog):
    port = free_port()
    proc = start_scheduler(tmp_path / "s.db", port, tmp_path / "s.log")
    client = QueueClient(QueueConfig(url=f"http://127.0.0.1:{port}", timeout_s=0.5), token=None)
    try:
        reg = Registration(client, WorkerState(), Ledger(), 0.2, world_size=1, model="m")
        reg.register(DEVICES)
        proc.kill()
        assert reg.leave() is False  # within the heartbeat's deadline, one interval
        assert f"could not tell the scheduler that worker {reg.worker_id} drained" in caplog.text
    finally:
        client.close()
        if proc.alive():
            proc.stop()
