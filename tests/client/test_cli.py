"""`dit` as users run it (a subprocess), against the real scheduler on 127.0.0.1 with no worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.local import free_port, start_scheduler

DIT = str(Path(sys.executable).with_name("dit"))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    port = free_port()
    proc = start_scheduler(tmp / "s.db", port, tmp / "s.log")
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def dit(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "DIT_URL": url, "COLUMNS": "120"}
    return subprocess.run([DIT, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_submit_status_and_cancel(url):
    sub = dit(url, "submit", "a lighthouse at dawn", "--size", "384x256", "--seed", "7")
    assert sub.returncode == 0, sub.stderr
    task_id = sub.stdout.strip()
    status = dit(url, "status", task_id)
    assert status.returncode == 0 and "queued" in status.stdout
    lines = dict(line.split(None, 1) for line in status.stdout.splitlines())  # piped: whole lines
    assert lines["id"] == task_id and lines["started_at"] == "-"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lines["created_at"])
    cancel = dit(url, "cancel", task_id)
    assert cancel.returncode == 0 and f"{task_id} cancelled" in cancel.stdout
    again = dit(url, "cancel", task_id)
    assert again.returncode == 2 and "already ended (cancelled)" in again.stderr
    ended = dit(url, "status", task_id)
    assert ended.returncode == 1 and "cancelled: cancelled by a client (while queued)" in ended.stdout


def test_a_url_without_scheme_is_http_and_a_wrong_one_fails_at_once(url):
    bare = url.removeprefix("http://")
    ok = dit(bare, "submit", "a lighthouse", "--size", "384x256")
    assert ok.returncode == 0, ok.stderr  # host:port, as curl takes it
    wrong = dit("ftp://127.0.0.1:1", "status", "t-1", timeout=10)  # not a minute of retries
    assert wrong.returncode == 2 and "not an http(s) address of the scheduler" in wrong.stderr


def test_a_wait_that_times_out_says_what_to_do_next(url):
    out = dit(url, "submit", "nobody serves this", "--wait", "--timeout", "1")
    assert out.returncode == 1 and "is still queued after 1s" in out.stderr and "dit cancel" in out.stderr


def test_an_output_file_means_waiting_for_it(url, tmp_path):
    out = dit(url, "submit", "nobody serves this", "-o", str(tmp_path / "f.png"), "--timeout", "1")
    assert out.returncode == 1 and "is still queued after 1s" in out.stderr  # waited, did not exit 0


def test_errors_name_what_to_do_and_set_the_exit_status(url):
    missing = dit(url, "status", "nope")
    assert missing.returncode == 2 and "check the id" in missing.stderr
    bad = dit(url, "submit", "x", "--size", "big")
    assert bad.returncode == 2 and "is not WIDTHxHEIGHT" in bad.stderr
    down = dit(f"http://127.0.0.1:{free_port()}", "--retry-deadline", "0.5", "status", "x")
    assert down.returncode == 3 and "is the scheduler running" in down.stderr


def test_watch_shows_the_queue_and_the_workers(url):
    dit(url, "submit", "waiting", "--priority", "3")
    out = dit(url, "watch", "--count", "1", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert "queued" in out.stdout and "p3: 1" in out.stdout and "workers" in out.stdout
