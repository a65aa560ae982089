"""The compile cache on the node's disk: one folder per torch/device fingerprint, reused by a
restart, a stranger's folder never used but named, old ones pruned; and, for real, a second process
takes its compiled graph from the cache that the first one left."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch

from worker.model.compile_cache import KEEP, META, CompileCache, fingerprint, folder_name

CPU = torch.device("cpu")
H100 = {"torch": "2.11.0+cu130", "python": "3.12.3", "machine": "x86_64", "triton": "3.6.0",
        "device": "NVIDIA H100 80GB HBM3", "capability": "sm90", "cuda": "13.0"}


@pytest.fixture(autouse=True)
def inductor_env(monkeypatch):
    # open() points Inductor at its folder through the environment; the test's change is undone.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/unused"))


def test_the_fingerprint_names_what_compiled_code_depends_on():
    fp = fingerprint(CPU)
    assert fp["torch"] == torch.__version__ and fp["device"] == "cpu" and fp["capability"]
    name = folder_name(H100)
    assert name.startswith("2.11.0-cu130-nvidia-h100-80gb-hbm3-sm90-")
    assert folder_name({**H100, "cuda": "12.8"}) != name  # every field counts, readable or not


def test_a_restart_reuses_its_folder(tmp_path, caplog):
    caplog.set_level(logging.INFO, "worker.model.compile_cache")
    first = CompileCache.open(tmp_path, CPU)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(first.folder)
    assert "compile cache: empty" in caplog.text
    meta = json.loads((first.folder / META).read_text())
    assert meta["fingerprint"] == fingerprint(CPU) and meta["created"] and meta["last_used"]
    caplog.clear()
    again = CompileCache.open(tmp_path, CPU)
    assert again.folder == first.folder and f"reusing {first.folder}" in caplog.text
    assert json.loads((again.folder / META).read_text())["created"] == meta["created"]


def test_another_torch_or_device_compiles_cold_and_says_what_the_cache_holds(tmp_path, caplog):
    CompileCache.open(tmp_path, CPU, fp=H100)  # the node ran another torch on a GPU before
    caplog.set_level(logging.INFO, "worker.model.compile_cache")
    cache = CompileCache.open(tmp_path, CPU)
    assert cache.folder.name != folder_name(H100)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder)
    warning = [r for r in caplog.records if r.levelno == logging.WARNING][0].getMessage()
    assert f"nothing for torch {torch.__version__} on cpu" in warning
    assert "torch 2.11.0+cu130 on NVIDIA H100 80GB HBM3 (sm90)" in warning and "compiling cold" in warning


def test_only_the_most_recently_used_fingerprints_are_kept(tmp_path):
    for n in range(KEEP + 1):
        old = CompileCache.open(tmp_path, CPU, fp={**H100, "torch": f"2.{n}.0"})
        os.utime(old.folder / META, (1000 + n, 1000 + n))  # used long ago, oldest first
    for n in (1, 2):  # folders set aside after failed compiles
        (tmp_path / f"{folder_name(H100)}.set-aside-{n}-1").mkdir()
        (tmp_path / f"{folder_name(H100)}.set-aside-{n}-1" / META).write_text("{}")
    (tmp_path / "someone-elses").mkdir()  # the root may be shared: not ours, never touched
    current = CompileCache.open(tmp_path, CPU)
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name != "someone-elses")
    assert (tmp_path / "someone-elses").is_dir()
    assert current.folder.name in kept and len([k for k in kept if ".set-aside-" not in k]) == KEEP
    assert folder_name({**H100, "torch": "2.0.0"}) not in kept  # the least recently used went
    assert [k for k in kept if ".set-aside-" in k] == [f"{folder_name(H100)}.set-aside-2-1"]


def test_setting_aside_moves_the_folder_once_and_starts_empty(tmp_path):
    cache = CompileCache.open(tmp_path, CPU)
    (cache.folder / "kernel.so").write_bytes(b"garbage")
    other_rank = CompileCache.open(tmp_path, CPU)  # the same folder, opened by another rank
    cache.set_aside(RuntimeError("backend='inductor' raised:\nCppCompileError: C++ compile error"))
    aside = [p for p in tmp_path.iterdir() if ".set-aside-" in p.name]
    assert len(aside) == 1 and (aside[0] / "kernel.so").exists()
    assert cache.folder.exists() and not (cache.folder / "kernel.so").exists() and (cache.folder / META).exists()
    other_rank.set_aside(RuntimeError("the same failure, seen by another rank"))
    assert len([p for p in tmp_path.iterdir() if ".set-aside-" in p.name]) == 1  # not moved again


def test_a_second_process_takes_its_graph_from_the_cache(compiled_once, compile_in_a_new_process, tmp_path):
    root, cold = compiled_once
    shutil.copytree(root, tmp_path / "cache")
    warm, log = compile_in_a_new_process(tmp_path / "cache")
    assert cold.endswith("{'hits': 0, 'misses': 1}") and warm.endswith("{'hits': 1, 'misses': 0}")
    assert cold.split()[0] == warm.split()[0]  # the same numbers from the cached code
    assert "compile cache: reusing" in log
