"""The benchmarks' one entry point, `python -m bench NAME`: every name reaches a module with a main,
every make target goes through it, and neither bench/ nor release/ is installed with the product."""

from __future__ import annotations

import importlib
import re
import tomllib

import pytest

from bench.__main__ import BENCHMARKS, main
from launch.local import REPO


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_name_reaches_a_module_with_a_main(name):
    module = importlib.import_module(BENCHMARKS[name][0])
    assert callable(module.main)


def test_without_a_name_it_lists_them_and_an_unknown_name_is_refused(capsys):
    assert main([]) == 2
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in BENCHMARKS)
    assert main(["no-such-bench"]) == 2
    assert "no benchmark named 'no-such-bench'" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_every_make_bench_target_calls_the_entry_point():
    make = (REPO / "Makefile").read_text()
    called = re.findall(r"\$\(PY\) -m bench (\S+)", make)
    targets = re.findall(r"^(bench[\w-]*):", make, flags=re.M)
    assert len(called) >= len(targets) >= 9  # bench-safety calls two
    assert set(called) <= set(BENCHMARKS) and set(called) == set(BENCHMARKS)
    assert not re.search(r"-m (tools|worker bench|scheduler bench)", make)


def test_bench_release_and_tests_are_not_installed():
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    included = setup["packages"]["find"]["include"]
    assert not any(p.split("*")[0] in ("bench", "release", "tests", "tools") for p in included)
    plugins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert all(not v.startswith(("bench", "release", "tests")) for group in plugins.values() for v in group.values())
