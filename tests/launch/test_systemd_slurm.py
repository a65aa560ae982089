"""The systemd units (systemd-analyze verify, where systemd is present) and the SLURM batch script
(run with stand-ins for srun and scontrol, down to node.sh's dry run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "launch" / "systemd"


def installed_copy(unit: str, tmp_path: Path) -> Path:
    """The unit as installed on this machine: this checkout for /opt/dit-worker, an existing user
    and environment file (verify checks that ExecStart is executable)."""
    env = tmp_path / "unit.env"
    env.write_text((UNITS / ("node.env" if unit == "dit-worker.service" else "scheduler.env")).read_text())
    # The scheduler unit runs the venv's dit-scheduler: the one of the Python running the tests.
    text = (UNITS / unit).read_text().replace("/opt/dit-worker/.venv/bin", str(Path(sys.executable).parent))
    text = text.replace("/opt/dit-worker", str(ROOT))
    text = text.replace("/etc/dit-worker/node.env", str(env)).replace("/etc/dit-worker/scheduler.env", str(env))
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    text = text.replace("User=dit", f"User={user}").replace("Group=dit", f"Group={group}")
    out = tmp_path / unit
    out.write_text(text)
    return out


@pytest.mark.parametrize("unit", ["dit-worker.service", "dit-scheduler.service"])
def test_systemd_analyze_verify_accepts_the_unit(unit, tmp_path):
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: `make install` installs Debian's systemd"
    out = subprocess.run(["systemd-analyze", "verify", str(installed_copy(unit, tmp_path))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr  # an unknown value only warns: none here


def test_the_worker_unit_drains_longer_than_node_sh_allows():
    unit = (UNITS / "dit-worker.service").read_text()
    env = (UNITS / "node.env").read_text()
    stop = int(next(line.split("=")[1] for line in unit.splitlines() if line.startswith("TimeoutStopSec=")))
    drain = int(next(line.split("=")[1].split()[0] for line in env.splitlines() if line.startswith("DRAIN_S=")))
    assert "Restart=always" in unit and "KillMode=mixed" in unit and "EnvironmentFile=" in unit
    assert stop >= drain + 30 + 30  # the drain, torchrun's own 30 s, a margin


def test_the_worker_unit_does_not_restart_what_no_restart_can_cure():
    from worker.main import EXIT_PERMANENT, EXIT_REFUSED
    from worker.preflight import EXIT_PERMANENT as CHECK_PERMANENT

    unit = (UNITS / "dit-worker.service").read_text()
    codes = next(line.split("=")[1].split() for line in unit.splitlines() if line.startswith("RestartPreventExitStatus="))
    assert {int(c) for c in codes} == {EXIT_PERMANENT, EXIT_REFUSED, CHECK_PERMANENT}


def test_the_scheduler_unit_does_not_restart_a_setting_that_cannot_work():
    from scheduler.__main__ import EXIT_CONFIG

    unit = (UNITS / "dit-scheduler.service").read_text()
    codes = next(line.split("=")[1].split() for line in unit.splitlines() if line.startswith("RestartPreventExitStatus="))
    assert [int(c) for c in codes] == [EXIT_CONFIG]


def test_the_scheduler_env_template_names_what_its_unit_uses():
    unit = (UNITS / "dit-scheduler.service").read_text()
    env = (UNITS / "scheduler.env").read_text()
    for name in ("DIT_DB", "DIT_WORKER_TOKENS", "DIT_CLIENT_TOKENS"):
        assert f"\n{name}=" in env
    assert "${DIT_DB}" in unit and "EnvironmentFile=/etc/dit-worker/scheduler.env" in unit


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a\\ngpu-b\\n"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NNODES", "RDZV", "NPROC", "GROUP"))}
    return {**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "4", "SLURM_SUBMIT_DIR": str(ROOT),
            "SLURM_JOB_ID": "4242", "SLURM_GPUS_ON_NODE": "8", "CONFIG": "configs/flux-schnell.toml"}


def sbatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "launch" / "slurm" / "dit-worker.sbatch"), "--dry-run", *args],
                          env=env, capture_output=True, text=True, timeout=30, cwd="/")


def test_slurm_runs_one_node_per_task_with_its_gpus(tmp_path):
    out = sbatch({**fake_slurm(tmp_path), "SLURM_NNODES": "2"}, "--set", "queue.url=http://q:8700")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("OMP_NUM_THREADS=4 torchrun --standalone --nproc_per_node=8 --max-restarts=1000"
                          " -m worker --config configs/flux-schnell.toml --set queue.url=http://q:8700\n")


def test_slurm_group_meets_at_the_first_nodes_rendezvous(tmp_path):
    out = sbatch({**fake_slurm(tmp_path), "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu-[a-b]", "GROUP": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("OMP_NUM_THREADS=4 torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=gpu-a:29400"
                          " --rdzv_id=dit-4242 --nproc_per_node=8 --max-restarts=1000 -m worker"
                          " --config configs/flux-schnell.toml\n")
