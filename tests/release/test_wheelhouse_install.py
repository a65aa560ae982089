"""The wheelhouse as an offline node uses it: built for this machine's Python and glibc, installed
with `--no-index` into a clean virtual environment that has only torch, and the demo run from that
environment (a scheduler and a one-rank worker serving real tasks), outside the checkout. One rank:
what the install must get right (every module, data file and entry point in the wheels) a rank
needs whatever the group's size; groups of ranks are the end-to-end tests' concern.

Building the wheelhouse needs the package registry, as `make install` does (pip's cache makes it
mostly local after that). This is the slowest test file (about 3 minutes on 2 cores)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launch.local import REPO

pytestmark = [pytest.mark.timeout(900), pytest.mark.integration]


def run(cmd: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd[:4]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    libc, glibc = platform.libc_ver()
    assert libc == "glibc"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    run([sys.executable, "-m", "release.wheelhouse", "--out", out, "--python-version", python, "--glibc", glibc,
         "--torch", torch.__version__], timeout=600, cwd=REPO)
    return out


def test_an_offline_install_from_the_wheelhouse_serves_the_demo(wheelhouse, tmp_path):
    names = {p.name.split("-")[0].lower() for p in wheelhouse.glob("*.whl")}
    assert "dit_worker" in names and "diffusers" in names and "torchao" in names  # the fp8 extra
    cuda = [n for n in names if n.startswith(("nvidia_", "triton")) and n != "nvidia_ml_py"]  # NVML is ours
    assert "torch" not in names and not cuda

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], timeout=120)
    py = venv / "bin" / "python"
    # What the node brings: torch and nothing else (its own requirements come with it). --no-compile:
    # Python compiles what is imported when it is imported; compiling every module up front took
    # two thirds of the install here.
    run([py, "-m", "pip", "install", "-q", "--no-compile", f"torch=={torch.__version__}"], timeout=600)
    run([py, "-m", "pip", "install", "-q", "--no-compile", "--no-index", "--find-links", wheelhouse,
         "dit-worker[fp8,tools]"], timeout=600)
    run([py, "-m", "pip", "check"], timeout=120)

    # A node's folder: its own config file, nothing of the checkout on the path.
    node = tmp_path / "node"
    (node / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "tiny.toml", node / "configs" / "tiny.toml")
    proc = run([py, "-m", "launch.demo", "--nproc", "1", "--timeout", "300"], timeout=600, cwd=node)
    assert "OK: images in" in proc.stdout
    where = run([py, "-c", "import worker; print(worker.__file__)"], timeout=60, cwd=node).stdout
    assert str(venv) in where  # served by the installed package, not the checkout
    assert len(list((node / "var" / "demo" / "images").glob("*.jpg"))) == 6
