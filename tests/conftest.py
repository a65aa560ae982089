"""Shared fixtures: the tiny models (built once per run) and a stack of real local processes
(tests/harness.py holds the helpers)."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path

import pytest

from tests.harness import Stack

pytest_plugins = ["tests.tiers", "pytester"]  # the quick tier and its guard; pytester for its test


def pytest_configure(config):
    """The processes the tests start get what a plain machine gives them, whatever the runner set.

    - SIGINT: a shell that starts a job in the background (`make test &`, some CI runners) starts it
      with SIGINT ignored, every child inherits that, and a shell cannot trap a signal ignored at its
      entry: node.sh would never see the Ctrl-C its tests send.
    - PYTHONDONTWRITEBYTECODE (these machines set it): every process the tests start (ranks,
      schedulers, CLIs: hundreds) compiled the checkout's modules from source again, and in the
      offline-install test's fresh venv (pip --no-compile) each of the demo's processes compiled torch
      and diffusers: that demo took 73 s with the variable, 48 s without, on a quiet 2-core machine.
      The bytecode goes to __pycache__, which git ignores."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    gc.disable()  # until the tests are collected (below)


def pytest_collection_finish(session):
    """Collection imports torch, diffusers, transformers, FastAPI and every test module: millions of
    objects that live as long as the run. The collector stays off while they are made, then
    freezes them, so that its full collections between and during tests walk only what the tests
    make (as the worker and the scheduler do at the end of their start-up)."""
    gc.collect()
    gc.freeze()
    gc.enable()


# The longest files (minutes each on the 2-core CI machine; per-file sums of a clean-clone run's
# `--junitxml`), longest first. Collected first, they start first on make test's pytest-xdist workers
# (a file per worker; the Makefile's --no-loadscope-reorder keeps this order, where xdist would put the
# files with the most tests first), and the many short files fill in around them; started last, one
# of them could end the run alone.
LONGEST_FIRST = ("e2e/test_recovery.py", "release/test_wheelhouse_install.py", "e2e/test_launch.py",
                 "safety/policy/test_built.py", "e2e/test_parallel.py", "bench/test_fleet_bench.py", "e2e/test_gcs.py",
                 "scheduler/test_schema_fuzz.py", "bench/test_bench.py")


# Fixtures that start processes or servers: a test that uses one is in the integration tier
# (tests/tiers.py), wherever it is; tests that start their own are marked in their files.
PROCESS_FIXTURES = {"stack", "make_stack", "postgres", "server", "emulator", "compiled_once", "compile_in_a_new_process"}


@pytest.hookimpl(tryfirst=True)  # before tests/tiers.py picks the quick tier by these marks
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)

    def rank(item) -> int:
        name = item.path.relative_to(tests).as_posix()
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each file, and of the other files, stays


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from launch.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-flux")


@pytest.fixture(scope="session")
def tiny_pixart(tmp_path_factory) -> Path:
    """A second DiT family, PixArt-Sigma, tiny and random, saved as from_pretrained reads it."""
    from launch.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-pixart", arch="tiny-pixart")


@pytest.fixture(scope="session")
def detoxify_dir(tmp_path_factory) -> Path:
    """A tiny random-weight detoxify checkpoint with its HF config and tokenizer, built offline."""
    from bench.random_safety import make_detoxify_checkpoint

    out = tmp_path_factory.mktemp("detoxify")
    make_detoxify_checkpoint(out)
    return out


@pytest.fixture(scope="session")
def vit_dir(tmp_path_factory) -> Path:
    """A tiny random-weight ViT image classifier (labels normal, nsfw) saved with save_pretrained."""
    from bench.random_safety import make_vit_classifier

    return make_vit_classifier(tmp_path_factory.mktemp("vit") / "nsfw-vit")


@pytest.fixture
def stack(tmp_path, tiny_model):
    s = Stack(tmp_path, tiny_model)
    yield s
    s.close()


@pytest.fixture
def make_stack(tmp_path, tiny_model):
    made: list[Stack] = []

    def make(**kw) -> Stack:
        made.append(Stack(tmp_path / f"stack{len(made)}", tiny_model, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL server for the session; `postgres.fresh()` makes an empty database."""
    from bench.servers import Postgres

    pg = Postgres(tmp_path_factory.mktemp("postgres"))
    yield pg
    pg.stop()
