"""The benchmark's running account: phases print as they start and end, the JSON is on disk after
each one, a phase past its limit or failing is recorded and the run goes on, SIGTERM is recorded
and ends the run. The clock is injected; the time limit interrupts a wait on an event that never
comes."""

from __future__ import annotations

import io
import itertools
import json
import threading

import pytest

from bench.worker.progress import Interrupted, Progress


@pytest.fixture
def progress(tmp_path):
    ticks = itertools.count()
    return Progress({"sizes": {}}, tmp_path / "bench.json", clock=lambda: float(next(ticks)), stream=io.StringIO())


def saved(progress) -> dict:
    return json.loads(progress.path.read_text())


def test_each_phase_is_printed_and_saved_as_it_starts_and_ends(progress):
    assert saved(progress)["status"] == "running"
    with progress.phase("128x128 baseline"):
        running = saved(progress)["phases"]  # read inside: an assertion here would be taken as the phase failing
        with progress.step("load"):
            pass
        progress.report["sizes"]["128x128"] = {"baseline": {"images_per_min": 60.0}}
    assert [(p["phase"], p["status"]) for p in running] == [("128x128 baseline", "running")]
    on_disk = saved(progress)
    assert [(p["phase"], p["status"], p.get("in")) for p in on_disk["phases"]] == [
        ("128x128 baseline", "ok", None), ("load", "ok", "128x128 baseline")]
    assert on_disk["sizes"]["128x128"]["baseline"]["images_per_min"] == 60.0  # saved with the phase's end
    assert all(p["seconds"] > 0 for p in on_disk["phases"])
    lines = progress.stream.getvalue().splitlines()
    assert lines[0].endswith("128x128 baseline ...") and lines[1].endswith("  load ...")
    assert "load: ok in" in lines[2] and "128x128 baseline: ok in" in lines[3]
    assert not list(progress.path.parent.glob("*.tmp"))  # written whole, then renamed


def test_a_failed_phase_is_recorded_and_the_next_one_runs(progress, capsys):
    with progress.phase("optimised"):
        with progress.step("warm-up"):
            raise RuntimeError("CUDA out of memory")
    with progress.phase("worker"):
        pass
    phases = {p["phase"]: p for p in saved(progress)["phases"]}
    assert phases["optimised"]["status"] == "failed"
    assert phases["optimised"]["error"] == "RuntimeError: CUDA out of memory"
    assert phases["warm-up"]["status"] == "failed" and phases["worker"]["status"] == "ok"
    assert progress.failed == 1  # the phase, not its step as well
    assert "RuntimeError: CUDA out of memory" in capsys.readouterr().err  # the traceback, for the log


def test_a_phase_past_its_limit_is_stopped_and_the_run_goes_on(progress):
    with progress.phase("compile", limit_s=0.2):
        threading.Event().wait()  # a compile that never ends
    with progress.phase("next"):
        pass
    phases = saved(progress)["phases"]
    assert phases[0]["status"] == "timed out" and phases[0]["limit_s"] == 0.2
    assert "past its limit of 0.2s" in phases[0]["error"]
    assert phases[1]["status"] == "ok" and progress.failed == 1


def test_sigterm_is_recorded_and_ends_the_run(progress):
    with pytest.raises(Interrupted):
        with progress.phase("worker"):
            with progress.step("measure"):
                raise Interrupted()
    progress.finish("interrupted")
    on_disk = saved(progress)
    assert on_disk["status"] == "interrupted"
    assert [p["status"] for p in on_disk["phases"]] == ["interrupted", "failed"]
