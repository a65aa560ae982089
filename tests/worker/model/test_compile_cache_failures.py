"""A compile cache that cannot help never stops the worker: a folder it cannot write leaves torch's
default; a damaged cache is set aside and the compile runs cold, once; a compile that fails for
another reason still fails."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from worker.model import engine as engine_module
from worker.model.compile_cache import CompileCache
from worker.model.engine import Engine

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def inductor_env(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/unused"))


def test_a_folder_that_cannot_be_written_leaves_torchs_default(tmp_path, caplog):
    root = tmp_path / "a-file"
    root.write_text("not a folder")
    before = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert CompileCache.open(root, CPU) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == before
    assert f"speed.compile_cache_dir: cannot write to {root}" in caplog.text


def test_a_damaged_cache_is_set_aside_and_the_compile_runs_cold(compiled_once, compile_in_a_new_process, tmp_path):
    root, first = compiled_once
    cache = shutil.copytree(root, tmp_path / "cache")
    libraries = list(cache.rglob("*.so"))
    assert libraries
    for lib in libraries:  # half-written files, as after a power cut
        lib.write_bytes(os.urandom(100))
    again, log = compile_in_a_new_process(cache)
    assert "a compile failed with the cache in use (BackendCompilerFailed" in log and "compiling cold" in log
    assert again.endswith("{'hits': 0, 'misses': 1}") and again.split()[0] == first.split()[0]
    assert len([p for p in cache.iterdir() if ".set-aside-" in p.name]) == 1


class Failure(Exception):
    pass


class Cache:
    def __init__(self) -> None:
        self.set_aside_for: list[BaseException] = []

    def set_aside(self, error: BaseException) -> None:
        self.set_aside_for.append(error)


@pytest.fixture
def compile_fails(monkeypatch):
    monkeypatch.setattr(engine_module, "compile_errors", lambda: (Failure,))


def failing(times: int):
    calls = []

    def run():
        calls.append(1)
        if len(calls) <= times:
            raise Failure(f"compile failed ({len(calls)})")
        return "images"
    return run, calls


def test_the_engine_compiles_cold_once_after_setting_the_cache_aside(compile_fails):
    cache = Cache()
    engine = Engine(None, None, CPU, compile_cache=cache)
    run, calls = failing(1)
    assert engine._compiling(run) == "images" and len(calls) == 2 and len(cache.set_aside_for) == 1
    run, calls = failing(1)  # a later failure: the cache was set aside already, so it is not the cause
    with pytest.raises(Failure):
        engine._compiling(run)
    assert len(cache.set_aside_for) == 1


def test_a_cold_compile_that_fails_still_fails(compile_fails):
    engine = Engine(None, None, CPU, compile_cache=Cache())
    run, _ = failing(2)
    with pytest.raises(Failure, match=r"\(2\)"):
        engine._compiling(run)
    with pytest.raises(Failure):  # no cache configured: nothing to retry
        Engine(None, None, CPU)._compiling(failing(1)[0])
