"""On-demand traces of rank 0's serve loop: the profiler armed over HTTP on the operator endpoint,
started and stopped by the loop's rounds, written on a thread of its own with every thread's
operators in it."""

from __future__ import annotations

import gzip
import json
import threading

import httpx
import pytest
import torch

from worker.config.schema import OpsConfig
from worker.serving.ledger import Ledger
from worker.serving.metrics import Metrics
from worker.serving.ops import Health, OpsServer
from worker.serving.profiling import ProfileBusy, Profiler
from worker.serving.state import WorkerState


def _round(size: int = 64) -> None:
    a = torch.randn(size, size)
    (a @ a).relu_()


def _other_thread_work(started: threading.Event, stop: threading.Event) -> None:
    while not stop.is_set():
        torch.nn.functional.softmax(torch.randn(32, 32), dim=-1)
        started.set()  # one operator done while the profiler ran


def test_a_trace_covers_the_rounds_asked_and_every_threads_operators(tmp_path):
    profiler = Profiler(tmp_path / "traces", torch.device("cpu"))
    profiler.before_round()  # nothing armed: nothing starts
    profiler.after_round()
    assert profiler.status()["state"] == "idle"
    trace = profiler.request(3)
    assert profiler.status()["state"] == "armed"
    started, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=_other_thread_work, args=(started, stop), name="post-pool-like")
    try:
        for i in range(3):
            profiler.before_round()
            if i == 0:
                other.start()
                assert started.wait(10)
            _round()
            profiler.after_round()
            if i < 2:
                assert profiler.status()["state"] == "running"
    finally:
        stop.set()
        other.join(10)
    profiler.join(60)
    status = profiler.status()
    assert status["state"] == "done", status
    assert status["rounds_done"] == 3 and status["trace"] == str(trace)
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::mm" in names  # the serve loop's thread
    assert "aten::softmax" in names or "aten::_softmax" in names  # another thread's
    table = trace.with_name(trace.name.replace(".json.gz", ".txt")).read_text()
    assert "aten::mm" in table
    profiler.before_round()  # done: a new round starts nothing until armed again
    assert profiler.status()["state"] == "done"


def test_one_trace_at_a_time_and_rounds_within_bounds(tmp_path):
    profiler = Profiler(tmp_path, torch.device("cpu"))
    for bad in (0, -1, 65):
        with pytest.raises(ValueError, match="rounds"):
            profiler.request(bad)
    profiler.request(1)
    with pytest.raises(ProfileBusy, match="armed"):
        profiler.request(1)
    profiler.before_round()
    with pytest.raises(ProfileBusy, match="running"):
        profiler.request(1)
    _round()
    profiler.after_round()
    profiler.join(60)
    assert profiler.status()["state"] == "done"
    profiler.request(2)  # done: another may be asked for
    assert profiler.status()["state"] == "armed"


@pytest.mark.integration
@pytest.mark.parametrize("ended_by", ["the profiler", "the ops endpoint"])
def test_a_loop_that_ends_mid_trace_writes_what_it_has(tmp_path, ended_by):
    profiler = Profiler(tmp_path, torch.device("cpu"))
    server = OpsServer(OpsConfig(host="127.0.0.1", port=0), Metrics(WorkerState(), Ledger(), torch.device("cpu")),
                       Health(WorkerState(), 300, 1800, lambda: False), profiler)
    server.start()
    trace = profiler.request(10)
    profiler.before_round()
    _round()
    profiler.after_round()
    # the serve loop ended after 1 of 10 rounds; its end stops the endpoint, which stops the trace
    profiler.finish() if ended_by == "the profiler" else server.stop()
    profiler.join(60)
    assert profiler.status()["state"] == "done" and profiler.status()["rounds_done"] == 1
    assert trace.is_file()
    server.stop()


def test_a_profiler_that_cannot_start_fails_the_trace_not_the_loop(tmp_path, monkeypatch):
    import worker.serving.profiling as profiling

    def broken(_device):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(profiling, "_start_profiler", broken)
    profiler = Profiler(tmp_path, torch.device("cpu"))
    profiler.request(2)
    profiler.before_round()  # does not raise
    profiler.after_round()
    status = profiler.status()
    assert status["state"] == "failed" and "CUPTI unavailable" in status["error"]
    profiler.request(1)  # a failed trace may be asked for again
    assert profiler.status()["state"] == "armed"


@pytest.mark.integration
@pytest.mark.parametrize("profile_dir", [True, False])
def test_the_operator_endpoint_arms_a_trace_and_says_how_it_stands(tmp_path, profile_dir):
    state = WorkerState()
    profiler = Profiler(tmp_path, torch.device("cpu")) if profile_dir else None
    server = OpsServer(OpsConfig(host="127.0.0.1", port=0), Metrics(state, Ledger(), torch.device("cpu")),
                       Health(state, 300, 1800, lambda: False), profiler)
    url = server.start()
    try:
        with httpx.Client(base_url=url, timeout=5) as http:
            if not profile_dir:  # ops.profile_dir empty: no such endpoint
                assert http.post("/profile?rounds=2").status_code == 404
                return
            assert http.get("/profile").json()["state"] == "idle"
            for bad in ("0", "65", "two"):
                resp = http.post(f"/profile?rounds={bad}")
                assert resp.status_code == 400 and "rounds" in resp.json()["error"], resp.text
            resp = http.post("/profile?rounds=2")
            assert resp.status_code == 202 and resp.json()["rounds"] == 2
            assert resp.json()["trace"].startswith(str(tmp_path))
            again = http.post("/profile")
            assert again.status_code == 409 and "armed" in again.json()["error"]
            assert http.get("/profile").json()["state"] == "armed"
            assert http.delete("/profile").status_code == 405
    finally:
        server.stop()
