"""launch/node.sh --dry-run: the exact torchrun command for one node and for a group across nodes,
and the refusals that name the variable to fix. (Serving and draining: tests/e2e/test_launch.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
