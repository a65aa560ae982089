"""The architecture's rules (pyproject.toml, [tool.importlinter]) hold on this tree, and a change that
breaks one fails: a copy of the tree with one forbidden import added is refused, naming the rule."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.local import REPO

PACKAGES = ["protocol", "worker", "safety", "scheduler", "tools", "launch", "tests"]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # The packages are found on PYTHONPATH, ahead of the installed (editable) ones.
    env = {**os.environ, "PYTHONPATH": str(root)}
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_contracts_hold():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("module, source, broken", [
    ("worker/serving/shortcut.py", "from scheduler.store import SQLiteStore\n",
     "Worker and scheduler meet only in the protocol BROKEN"),
    ("worker/model/shortcut.py", "from worker.serving.task import Task\n",
     "Worker layers"),
    ("worker/storage/shortcut.py", "import tools.bench.figures\n",
     "The product never imports its tools, launch helpers or tests BROKEN"),
    ("worker/storage/base.py", "import worker.storage.gcs\n",
     "No import cycles between the modules of a package BROKEN"),
])
def test_a_forbidden_import_is_refused(tmp_path, module, source, broken):
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    path.write_text((path.read_text() if path.exists() else "") + source)
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    assert broken in proc.stdout, proc.stdout[-3000:]
