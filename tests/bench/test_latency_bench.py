"""`make bench-latency`: one request at a time against a real idle worker, and the arithmetic that
splits its overhead into parts."""

from __future__ import annotations

import json

import pytest

from bench import latency as latency_bench

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def sample(sent: float, started: float, finished: float, received: float, **timings) -> dict:
    base = {"text_check": 5.0, "admit": 3.0, "wait": 1.0, "broadcast": 1.0, "image_check": 40.0, "encode": 8.0,
            "store": 6.0, "generate": 1000.0, "settle": 50.0}
    result = {"timings_ms": {**base, **timings}, "bytes": 10, "content_type": "image/jpeg"}
    return {"sent": sent, "received": received, "response_ms": (received - sent) * 1e3,
            "task": {"started_at": started, "finished_at": finished, "result": result}}


def test_the_parts_add_up_to_the_overhead_with_the_overlapped_stages_counted_once():
    s = sample(sent=100.0, started=100.010, finished=101.070, received=101.072)
    parts = latency_bench.parts(s)
    assert parts["submit -> lease"] == pytest.approx(2.0)  # 10 ms less the text check and admit
    assert parts["image check | encode"] == 40.0 and "settle" not in parts  # before the task arrived
    assert parts["hand-off and report"] == pytest.approx(1060 - 1 - 1 - 40 - 6 - 1000)
    assert parts["result -> response"] == pytest.approx(2.0)
    overhead = s["response_ms"] - 1000.0
    assert sum(parts.values()) == pytest.approx(overhead)


def test_random_weights_build_the_architecture_and_the_safety_models_and_ignore_model(tmp_path, monkeypatch):
    import argparse

    from bench import random_safety

    monkeypatch.setattr(random_safety, "bench_overrides", lambda models: [f"safety.built_in={models}"])
    args = argparse.Namespace(random_weights="flux.1-schnell", model="models/tiny-flux")
    assert latency_bench.model_overrides(args, tmp_path) == [
        "model.random_arch=flux.1-schnell", f"safety.built_in={tmp_path / 'models'}"]
    args.random_weights = None
    assert latency_bench.model_overrides(args, tmp_path)[0].startswith("model.source=/")
    args.model = ""
    assert latency_bench.model_overrides(args, tmp_path) == []


def test_a_run_against_a_real_worker_reports_the_overhead_and_its_parts(tmp_path, tiny_model, capsys):
    out = tmp_path / "latency.json"
    argv = ["--model", str(tiny_model), "--requests", "3", "--warmup", "1", "--size", "256x256", "--out", str(out)]
    assert latency_bench.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == 3 and report["content_type"] == "image/jpeg"  # the default format
    o = report["overhead_ms"]
    assert 0 < o["p50"] <= o["p95"] <= o["max"] < report["response_ms"]["p95"]
    assert all(v >= 0 for v in report["parts_ms_p50"].values())
    assert abs(sum(report["parts_share"].values()) - 1) < 0.01
    printed = capsys.readouterr().out
    assert "overhead            p50" in printed and "image check | encode" in printed
