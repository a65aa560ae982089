"""The benchmark's smoke run (tiny model, CPU): all three phases run and the JSON and plot are
written; a run stopped in the middle keeps the phases it finished. No timing is asserted; the
figures are for reading, not for passing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psutil
import pytest

from launch.local import REPO
from worker.model.architectures import ARCHS
from bench.worker.cli import transformer_flop
from bench.worker.figures import with_tflops

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def test_flop_count_matches_the_published_arithmetic():
    # shared/ANCHORS.md: 74.1 TF per step at 1360x768 with 512 text tokens (59.3 linear + 14.8 attention).
    tf = transformer_flop(ARCHS["flux.1-schnell"]["transformer"], 1360, 768, 512, steps=1) / 1e12
    assert tf == pytest.approx(74.1, rel=0.005)


def test_a_slow_run_of_a_tiny_model_still_shows_the_work_it_did():
    # 3 images of 1e8 FLOP in 10 s: 3e-5 TFLOP/s, which four decimals rounded to 0.
    assert with_tflops({"images": 3, "seconds": 10.0}, 1e8)["tflops"] == 3e-5
    assert with_tflops({"images": 3, "seconds": 1.0}, 5.12345e14)["tflops"] == 1537.0


def test_smoke_run_writes_json_and_plot(tiny_model, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "worker", "--config", "configs/tiny.toml", "--images", "3",
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
    assert report["status"] == "done" and all(p["status"] == "ok" for p in report["phases"])
    assert {"128x128 baseline", "128x128 optimised", "128x128 worker"} <= {p["phase"] for p in report["phases"]}
    assert "128x128 worker ..." in proc.stdout and "128x128 worker: ok in" in proc.stdout  # as it went


def start_bench(tiny_model, out, phases="baseline,optimised,worker"):
    return subprocess.Popen(
        [sys.executable, "-m", "bench", "worker", "--config", "configs/tiny.toml", "--images", "2",
         "--size", "64x64", "--out", str(out), "--set", f"model.source={tiny_model}",
         "--set", "safety.text.backend=profanity", "--phase-limit-s", "300", "--phases", phases],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc, text: str) -> list[str]:
    """The bench's lines up to the first that ends with `text` (it prints as it goes)."""
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if lines[-1].endswith(text):
            return lines
    raise AssertionError(f"the bench ended ({proc.wait()}) before {text!r}:\n" + "\n".join(lines[-20:]))


def leftovers(out) -> list[psutil.Process]:
    """Processes started for this run (their command lines name its folder)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(out) in arg for arg in p.info["cmdline"] or []):
            found.append(p)
    return found


@pytest.mark.timeout(240)
def test_a_run_killed_by_a_time_limit_keeps_the_phases_it_finished(tiny_model, tmp_path):
    out = tmp_path / "bench"
    proc = start_bench(tiny_model, out)
    try:
        read_until(proc, "64x64 optimised ...")
        proc.send_signal(signal.SIGKILL)  # what a time limit does: no chance to write anything more
        proc.wait(30)
    finally:
        proc.kill()
    report = json.loads((out / "bench.json").read_text())
    assert report["status"] == "running"  # it never got to say otherwise
    phases = {p["phase"]: p for p in report["phases"]}
    assert phases["64x64 baseline"]["status"] == "ok" and phases["64x64 optimised"]["status"] == "running"
    baseline = report["sizes"]["64x64"]["baseline"]
    assert baseline["images"] == 2 and baseline["images_per_min"] > 0
    assert "optimised" not in report["sizes"]["64x64"]


@pytest.mark.timeout(240)
def test_sigterm_mid_phase_saves_what_ran_and_stops_what_it_started(tiny_model, tmp_path):
    out = tmp_path / "bench"
    proc = start_bench(tiny_model, out, phases="optimised,worker")
    try:
        read_until(proc, "measure (2 tasks in a burst) ...")  # the scheduler and the worker are running
        assert leftovers(out)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    report = json.loads((out / "bench.json").read_text())
    assert report["status"] == "interrupted"
    statuses = {p["phase"]: p["status"] for p in report["phases"] if "in" not in p}
    assert statuses == {"64x64 optimised": "ok", "64x64 worker": "interrupted"}
    assert "optimised" in report["sizes"]["64x64"] and "worker" not in report["sizes"]["64x64"]
    left = leftovers(out)  # the worker phase's cleanup ran: scheduler and ranks stopped
    for p in left:
        p.kill()
    assert not left, [p.info["cmdline"][:4] for p in left]


def test_random_weights_are_saved_once_and_loaded_from_disk_as_a_node_loads(tmp_path, monkeypatch):
    """--weights-dir: the random pipeline is written once (whole, through a staging folder), then
    every phase and every later run loads it with from_pretrained."""
    from diffusers import DiffusionPipeline

    import worker.model.architectures as architectures
    from bench.worker.cli import saved_random_pipeline

    folder = tmp_path / "weights"
    assert saved_random_pipeline("tiny", folder, "float32") == folder
    assert (folder / "model_index.json").is_file() and not (tmp_path / "weights.partial").exists()

    def built_again(*_a, **_k):
        raise AssertionError("a saved pipeline was built again")

    monkeypatch.setattr(architectures, "build_pipeline", built_again)
    assert saved_random_pipeline("tiny", folder, "float32") == folder
    pipe = DiffusionPipeline.from_pretrained(folder)
    assert type(pipe).__name__ == "FluxPipeline"
