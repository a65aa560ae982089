"""The architecture's rules (pyproject.toml, [tool.importlinter]) hold on this tree, and a change that
breaks one fails: a copy of the tree with one forbidden import added is refused, naming the rule. And
rank 0's task lifecycle has one owner: only worker.serving.ledger assigns a task's fate, and counters
are typed, their wire names written there alone."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.local import REPO

PACKAGES = ["protocol", "worker", "safety", "scheduler", "bench", "release", "launch", "tests"]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # The packages are found on PYTHONPATH, ahead of the installed (editable) ones.
    env = {**os.environ, "PYTHONPATH": str(root)}
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_contracts_hold():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("module, source, broken", [
    ("worker/serving/shortcut.py", "from scheduler.store import SQLiteStore\n",
     "Worker and scheduler meet only in the protocol BROKEN"),
    ("worker/model/shortcut.py", "from worker.serving.task import Task\n",
     "Worker layers"),
    ("worker/storage/shortcut.py", "import bench.worker.figures\n",
     "The product never imports bench, release, launch or tests BROKEN"),
    ("worker/storage/base.py", "import worker.storage.gcs\n",
     "No import cycles between the modules of a package BROKEN"),
    ("worker/serving/ledger.py", "import worker.serving.post\n",
     "Rank 0 in the order of a task's life"),
    ("scheduler/store/tasks.py", "import scheduler.api.errors\n",
     "Scheduler layers"),
])
@pytest.mark.integration
def test_a_forbidden_import_is_refused(tmp_path, module, source, broken):
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    path.write_text((path.read_text() if path.exists() else "") + source)
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    assert broken in proc.stdout, proc.stdout[-3000:]


# ---------------------------------------------------------------- rank 0's task lifecycle

SERVING = REPO / "worker" / "serving"
LEDGER = "ledger.py"  # worker.serving.ledger: the one owner of each held task's fate and of the counters


def serving_modules() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(), str(p)) for p in sorted(SERVING.glob("*.py"))}


def fate_words() -> set[str]:
    from worker.serving.ledger import Fate

    return {"fate"} | {f.value for f in Fate}


def assigned_attributes(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every attribute assigned (x.name = ..., x.name += ...) or set by setattr."""
    out = []
    for node in ast.walk(tree):
        targets = {ast.Assign: lambda n: n.targets, ast.AugAssign: lambda n: [n.target],
                   ast.AnnAssign: lambda n: [n.target]}.get(type(node), lambda n: [])(node)
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute):
                    out.append((sub.lineno, sub.attr))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            out.append((node.lineno, str(node.args[1].value)))
    return out


def fates_outside_comparisons(tree: ast.Module) -> list[int]:
    """Lines where a `Fate.X` is used other than in a comparison (passed, stored, returned)."""
    compared = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                for operand in (node.left, *node.comparators) for sub in ast.walk(operand)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Fate"
            and id(node) not in compared]


def test_only_the_ledger_assigns_a_tasks_fate():
    words = fate_words()
    found = []
    for name, tree in serving_modules().items():
        if name == LEDGER:
            continue
        found += [f"{name}:{line} assigns .{attr}" for line, attr in assigned_attributes(tree)
                  if attr.lstrip("_") in words]
        found += [f"{name}:{line} uses a Fate outside a comparison" for line in fates_outside_comparisons(tree)]
    assert found == [], "a task's fate is the ledger's alone (worker.serving.ledger):\n" + "\n".join(found)


def test_the_rule_on_fates_catches_a_flag_kept_elsewhere():
    flag = ast.parse("def expire(held):\n    held.task.abandoned = True\n")
    passed = ast.parse("def drop(ledger, held):\n    ledger._move(held, Fate.LOST)\n")
    asked = ast.parse("def gone(ledger, t):\n    return ledger.fate(t) is Fate.LOST\n")
    assert [a for _, a in assigned_attributes(flag) if a in fate_words()] == ["abandoned"]
    assert fates_outside_comparisons(passed) == [2] and fates_outside_comparisons(asked) == []


def string_keyed_counts(tree: ast.Module) -> list[int]:
    """Lines of counter calls named by a string: the old count("...")/set_counter/raise_counter, or a
    Tally method given a literal or an f-string."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in ("count", "set_counter", "raise_counter"):
            lines.append(node.lineno)
        elif (node.func.attr in ("add", "set", "high_water") and node.args
              and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))):
            lines.append(node.lineno)
    return lines


def test_counters_are_typed_and_their_wire_names_written_once():
    from worker.serving.ledger import FAILED_PREFIX, Counter

    names = {c.value for c in Counter} | {FAILED_PREFIX}
    found = []
    for name, tree in serving_modules().items():
        found += [f"{name}:{line} counts by a string" for line in string_keyed_counts(tree)]
        if name != LEDGER:
            found += [f"{name}:{node.lineno} spells the counter {node.value!r}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in names]
    assert found == [], "\n".join(found)
    old = 'state.count("leases_lost")\nc.add(f"tasks_{s}")\nc.add(Counter.REPORTS)'
    assert string_keyed_counts(ast.parse(old)) == [1, 2]
