"""The tiers' guard (tests/tiers.py) on a planted test file, in a pytest run of its own: a test that
starts a process or listens on a socket without the `integration` marker is an error in either tier."""

from __future__ import annotations

import pytest

PLANTED = '''
import socket, subprocess, sys
import pytest

def test_in_process():
    assert sum([1, 2]) == 3

def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()

@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s

def test_uses_a_server(server):
    assert server.getsockname()[0] == "127.0.0.1"

@pytest.mark.integration
def test_marked(server):
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


@pytest.mark.integration  # the planted tests start a process and listen, in this process
@pytest.mark.parametrize("tier", ["all", "quick"])
def test_an_unmarked_test_that_starts_a_process_or_listens_is_an_error(pytester, tier):
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_inprocess("-p", "tests.tiers", "--tier", tier, "-p", "no:cacheprovider")
    # Each unmarked test passes its call and errors at teardown; the marked one runs only in "all",
    # and uses the server the unmarked one started first.
    result.assert_outcomes(passed=5 if tier == "all" else 4, errors=3)
    result.stdout.fnmatch_lines_random([
        "*test_starts_a_process starts a process but is not marked `integration`*",
        "*test_listens listens on a socket but is not marked `integration`*",
        "*test_uses_a_server listens on a socket but is not marked `integration`*"])
    assert "test_in_process listens" not in result.stdout.str() and "test_marked " not in result.stdout.str()
