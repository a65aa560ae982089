"""Where the harness finds PostgreSQL's programs: Debian's package (its newest version), else the
build the pgserver wheel carries, else a clear error saying how to get one."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bench.servers import postgres_bin

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def program(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "postgres").write_text("")
    return path


def test_debians_newest_version_is_taken(tmp_path):
    program(tmp_path / "15" / "bin")
    newest = program(tmp_path / "16" / "bin")
    assert postgres_bin(debian=tmp_path) == newest


def test_without_the_package_the_pgserver_wheels_build_is_taken(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "pgserver").mkdir(parents=True)
    (site / "pgserver" / "__init__.py").write_text("")
    wheel = program(site / "pgserver" / "pginstall" / "bin")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert postgres_bin(debian=tmp_path / "no-debian") == wheel


def test_with_neither_the_error_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install postgresql, or pip install pgserver"):
        postgres_bin(debian=tmp_path)
