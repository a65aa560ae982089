"""The benchmark's smoke run (tiny model, CPU): all three phases run and the JSON and plot are
written. No timing is asserted; the figures are for reading, not for passing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launch.local import REPO
from worker.model.architectures import ARCHS
from tools.bench.cli import transformer_flop


def test_flop_count_matches_the_published_arithmetic():
    # shared/ANCHORS.md: 74.1 TF per step at 1360x768 with 512 text tokens (59.3 linear + 14.8 attention).
    tf = transformer_flop(ARCHS["flux.1-schnell"]["transformer"], 1360, 768, 512, steps=1) / 1e12
    assert tf == pytest.approx(74.1, rel=0.005)


def test_smoke_run_writes_json_and_plot(tiny_model, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "bench", "--config", "configs/tiny.toml", "--images", "3",
         "--size", "128x128", "--out", str(out), "--set", f"model.source={tiny_model}",
         "--set", "safety.text.backend=profanity", "--set", "batch.max_size=2"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads((out / "bench.json").read_text())
    entry = report["sizes"]["128x128"]
    for phase in ("baseline", "optimised", "worker"):
        assert entry[phase]["images"] == 3 and entry[phase]["images_per_min"] > 0
        assert entry[phase]["latency_ms"]["p95"] >= entry[phase]["latency_ms"]["p50"] > 0
        assert entry[phase]["tflops"] > 0
    stages = entry["worker"]["stages_ms_per_image"]
    assert {"lease", "text_check", "broadcast", "denoise", "vae", "image_check", "encode", "store",
            "report"} <= set(stages)
    assert set(entry["ratios"]) == {"optimised_over_baseline", "worker_time_over_optimised", "worker_over_baseline"}
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
