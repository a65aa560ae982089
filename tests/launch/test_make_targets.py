"""`make scheduler` and `make node`, the README's local recipe: the status page may show what the node
stores, and a stop signal to make waits for the node's drain instead of leaving it behind."""

from __future__ import annotations

import os
import signal
import subprocess
import tomllib

import pytest

from launch.local import REPO, wait_until

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

STUB = """#!/bin/bash
# launch/node.sh's stand-in: records what it was given, drains for a second on SIGTERM, exits 0.
echo "$CONFIG $NPROC" > "$OUT/started"
trap 'sleep 1; echo drained > "$OUT/drained"; exit 0' TERM
while true; do sleep 0.05; done
"""


def test_make_scheduler_lets_the_status_page_show_what_make_node_stores():
    dry = subprocess.run(["make", "-n", "-o", "install", "scheduler"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    root = tomllib.loads((REPO / "configs" / "tiny.toml").read_text())["storage"]["local"]["root"]
    assert f"exec .venv/bin/python -m scheduler --api-results-roots {root}" in dry  # exec: make waits for its stop


def test_a_stop_signal_to_make_node_waits_for_the_node_to_drain(tmp_path):
    (tmp_path / "launch").mkdir()
    stub = tmp_path / "launch" / "node.sh"
    stub.write_text(STUB)
    stub.chmod(0o755)
    make = subprocess.Popen(["make", "-f", str(REPO / "Makefile"), "-C", str(tmp_path), "-o", "install",
                             "-o", "models/tiny-flux/model_index.json", "node", "NPROC=3"],
                            env={**os.environ, "OUT": str(tmp_path)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "started").exists(), 30, "the node to start")
        assert (tmp_path / "started").read_text().split() == ["configs/tiny.toml", "3"]
        make.send_signal(signal.SIGTERM)
        code = make.wait(30)
    finally:
        if make.poll() is None:
            make.kill()
    assert (tmp_path / "drained").exists(), "make returned before the node had drained"
    assert code == -signal.SIGTERM  # make ends by the signal it got (143 in a shell), whatever node.sh returned


def test_the_two_model_recipe_names_the_same_models_on_both_sides():
    """README's two models locally: the worker's [model] and [models.<id>] are the scheduler's ids."""
    from scheduler.config import load_config as scheduler_config
    from worker.config.loader import load_config as worker_config

    worker = worker_config(REPO / "configs" / "tiny-models.toml")
    fleet = scheduler_config(REPO / "configs" / "scheduler-tiny-models.toml", environ={})
    assert list(worker.catalog) == list(fleet.models.ids) == ["tiny-flux", "tiny-pixart"]
    assert worker.models["tiny-pixart"].source == "models/tiny-pixart"
    # -B: as on a fresh clone, where neither model is built yet; make node builds the second one too.
    dry = subprocess.run(["make", "-n", "-B", "-o", "install", "-o", ".venv/.installed", "node",
                          "CONFIG=configs/tiny-models.toml"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "make-tiny-model --arch tiny-pixart models/tiny-pixart" in dry
