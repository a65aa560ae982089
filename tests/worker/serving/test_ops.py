"""Rank 0's operator endpoint: /metrics, /livez and /readyz over real HTTP on 127.0.0.1, health
decided on an injected clock."""

from __future__ import annotations

import socket

import httpx
import pytest
import torch

from worker.config import ConfigError
from worker.config.schema import OpsConfig
from worker.serving.ledger import Counter, Ledger
from worker.serving.metrics import Metrics
from worker.serving.ops import Health, OpsServer
from worker.serving.state import WorkerState
from tests.harness import Clock

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.fixture
def node():
    clock = Clock()
    state, ledger = WorkerState(clock=clock), Ledger(clock=clock)
    draining = {"on": False}
    health = Health(state, stall_s=300, load_s=1800, draining=lambda: draining["on"])
    server = OpsServer(OpsConfig(host="127.0.0.1", port=0), Metrics(state, ledger, torch.device("cpu")), health)
    url = server.start()
    yield url, state, ledger, clock, draining
    server.stop()


def probe(url: str, path: str) -> tuple[int, dict]:
    resp = httpx.get(f"{url}{path}", timeout=5)
    return resp.status_code, resp.json()


def test_readiness_turns_true_after_warm_up_and_false_while_draining(node):
    url, state, _, clock, draining = node
    assert probe(url, "/readyz") == (503, {"ok": False, "reason": "loading and warming up"})
    assert probe(url, "/livez")[0] == 200  # loading is alive
    state.set_status("ready")  # the serve loop starts only after warm-up
    state.progress()
    assert probe(url, "/readyz") == (200, {"ok": True, "reason": "ready"})
    state.storage_outcome(False)
    assert probe(url, "/readyz")[1]["reason"].startswith("storage unavailable")
    state.storage_outcome(True)
    draining["on"] = True
    assert probe(url, "/readyz") == (503, {"ok": False, "reason": "draining: no new work"})
    assert probe(url, "/livez")[0] == 200  # draining is not dead


def test_liveness_turns_false_when_the_serve_loop_stalls_past_its_deadline(node):
    url, state, _, clock, _ = node
    state.set_status("ready")
    state.progress()
    clock.now += 299
    assert probe(url, "/livez")[0] == 200
    clock.now += 2
    code, body = probe(url, "/livez")
    assert code == 503 and body["reason"].startswith("serve loop stalled: no finished turn for 301s")
    state.progress()  # a turn finished
    assert probe(url, "/livez")[0] == 200


def test_a_load_that_outlasts_its_timeout_is_not_alive(node):
    url, state, _, clock, _ = node
    clock.now += 1801
    assert probe(url, "/livez") == (503, {"ok": False, "reason": "loading for 1801s (limit 1800s)"})


def test_metrics_are_served_and_other_paths_are_404(node):
    url, _, ledger, *_ = node
    ledger.counters.add(Counter.TASKS_SUCCEEDED, 2)
    text = httpx.get(f"{url}/metrics", timeout=5).text
    assert 'dit_worker_tasks_total{outcome="succeeded"} 2.0' in text
    assert "process_resident_memory_bytes" in text
    assert httpx.get(f"{url}/nope", timeout=5).status_code == 404


def test_a_busy_port_is_refused_at_start_naming_the_field():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = WorkerState()
        server = OpsServer(OpsConfig(host="127.0.0.1", port=port), Metrics(state, Ledger(), torch.device("cpu")),
                           Health(state, 300, 1800, lambda: False))
        with pytest.raises(ConfigError, match=f"ops.port: cannot listen on 127.0.0.1:{port}"):
            server.start()
