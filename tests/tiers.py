"""The two test tiers, and the guard that keeps them honest.

- quick (`make test-quick`, `pytest --tier quick`): the tests that run inside pytest's process. The
  inner loop's tier.
- everything (`make test`, what CI runs): the quick tier and the tests marked `integration`, which start
  processes or servers: a real scheduler, torchrun ranks, PostgreSQL, the GCS emulator, Chromium, a
  uvicorn server in a thread, a fresh virtual environment.

The guard watches every test that is not marked `integration`, fixtures included: starting a process
(subprocess, multiprocessing, fork, posix_spawn) or listening on a socket is a mistake of marking.
The test's teardown then reports an error naming the marker it lacks, in either tier, so a wrong
marking cannot land. (Refusing the process there and then was tried: code that retries what fails
turned the refusal into hangs and deep tracebacks, and a test that says nothing of it is worse.)
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from contextlib import ExitStack, contextmanager, nullcontext

import pytest

MARKER = "integration"
_CAUGHT = pytest.StashKey[str]()


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("quick", "all"), default="all",
                     help="quick: only the tests that run in pytest's process (not marked integration)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{MARKER}: starts processes or servers (real scheduler, torchrun ranks, PostgreSQL, "
                   "emulator, browser, fresh venv); never in the quick tier")


@pytest.hookimpl(trylast=True)  # after the marks that conftest.py adds by fixture
def pytest_collection_modifyitems(config, items):
    if config.getoption("--tier") != "quick":
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker(MARKER) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _watched(item):
    """The guard around a test's setup or call (its teardown stops what it started: not watched, since
    the last test of a module or session also tears down the shared fixtures that other tests used)."""
    if item.get_closest_marker(MARKER):
        return nullcontext()

    def caught(what: str) -> None:
        item.stash.setdefault(_CAUGHT, f"{item.nodeid} {what} but is not marked `{MARKER}` (tests/tiers.py)")

    return _guard(caught)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's teardown reports the marking mistake as an error, in either tier."""
    report = yield
    message = item.stash.get(_CAUGHT, None)
    if call.when == "teardown" and message and report.passed:
        report.outcome, report.longrepr = "failed", message
    return report


@contextmanager
def _guard(caught):
    """Every way this process can start another, and a listening socket, report to `caught` first."""

    def wrap(owner, name, what):
        real = getattr(owner, name)

        def guarded(*args, **kwargs):
            caught(what)
            return real(*args, **kwargs)

        return owner, name, real, guarded

    patches = [
        wrap(_posixsubprocess, "fork_exec", "starts a process"),  # subprocess, multiprocessing spawn
        wrap(subprocess.Popen, "_execute_child", "starts a process"),  # posix_spawn path included
        wrap(os, "fork", "forks"),
        wrap(os, "posix_spawn", "starts a process"),
        wrap(os, "posix_spawnp", "starts a process"),
        wrap(socket.socket, "listen", "listens on a socket"),
    ]
    with ExitStack() as undo:
        for owner, name, real, guarded in patches:
            setattr(owner, name, guarded)
            undo.callback(setattr, owner, name, real)
        yield
