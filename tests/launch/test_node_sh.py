"""launch/node.sh --dry-run: the exact torchrun command for one node and for a group across nodes,
and the refusals that name the variable to fix. (Serving and draining: tests/e2e/test_launch.py.)"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from launch.local import wait_until

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

ROOT = Path(__file__).resolve().parents[2]


def dry_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("NNODES", "RDZV_ENDPOINT", "RDZV_ID", "NPROC")}
    return subprocess.run(["bash", str(ROOT / "launch/node.sh"), "--dry-run", *args], cwd=ROOT,
                          env={**clean, "OMP_NUM_THREADS": "4", **env}, capture_output=True, text=True, timeout=30)


def test_one_node():
    out = dry_run({"CONFIG": "configs/flux-schnell.toml", "NPROC": "8"}, "--set", "queue.url=http://q:8700")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("OMP_NUM_THREADS=4 torchrun --standalone --nproc_per_node=8 --max-restarts=1000"
                          " -m worker --config configs/flux-schnell.toml --set queue.url=http://q:8700\n")


def test_a_two_node_group_meets_at_a_c10d_rendezvous():
    out = dry_run({"NPROC": "8", "NNODES": "2", "RDZV_ENDPOINT": "node-a:29400", "RDZV_ID": "flux-1",
                   "MAX_RESTARTS": "3"}, "--set", "queue.token_env=QUEUE TOKEN")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("OMP_NUM_THREADS=4 torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node-a:29400"
                          " --rdzv_id=flux-1 --nproc_per_node=8 --max-restarts=3 -m worker --config"
                          " configs/flux-schnell.toml --set queue.token_env=QUEUE\\ TOKEN\n")  # quoted for a shell


def test_a_group_without_a_rendezvous_or_with_a_bad_node_count_is_refused():
    out = dry_run({"NPROC": "8", "NNODES": "2"})
    assert out.returncode == 2 and "RDZV_ENDPOINT" in out.stderr and not out.stdout
    out = dry_run({"NPROC": "8", "NNODES": "two", "RDZV_ENDPOINT": "a:1"})
    assert out.returncode == 2 and "NNODES=two" in out.stderr


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_drain_longer_than_drain_s_is_cut_short(tmp_path):
    """A torchrun stand-in whose rank ignores the drain signal: node.sh stops the group after DRAIN_S."""
    import signal
    import time

    fake = tmp_path / "torchrun"
    fake.write_text("#!/usr/bin/env bash\n"
                    "trap 'echo torchrun: stopped >&2; exit 1' TERM\n"
                    "bash -c 'trap \"\" TERM; exec sleep 60' &\n"  # a rank whose drain never ends
                    "echo started $! >&2\n"
                    # `wait` with no operand returns 0 once its children are gone: where the rank's
                    # KILL is reaped before the TERM's trap runs, torchrun ends 1 all the same.
                    "wait\n"
                    "exit 1\n")
    fake.chmod(0o755)
    import sys

    # The real `dit-worker check` runs first: the venv's bin on PATH, a config this machine can run.
    env = {**os.environ, "PATH": f"{tmp_path}:{Path(sys.executable).parent}:{os.environ['PATH']}", "NPROC": "1",
           "DRAIN_S": "1", "OMP_NUM_THREADS": "1", "CONFIG": "configs/tiny.toml"}
    proc = subprocess.Popen(["bash", str(ROOT / "launch/node.sh")], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        word, rank = proc.stderr.readline().split()
        assert word == "started"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        elapsed = time.monotonic() - t0
        # The stuck rank is killed too, not left behind when torchrun exits before it.
        wait_until(lambda: dead(int(rank)), 5, "the stuck rank killed")
        said = proc.stderr.read()  # ends: node.sh killed the stuck rank, which held stderr open
        assert rc == 1 and elapsed < 10
        assert "draining for at most 1s" in said and "the drain took over DRAIN_S=1s; stopping now" in said
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_drain_s_must_be_seconds():
    out = dry_run({"DRAIN_S": "5m"})
    assert out.returncode == 2 and "DRAIN_S=5m is not a number of seconds" in out.stderr
