"""End to end with the real scheduler and a worker (one rank: the subject is the client):
`dit submit --wait -o x.png` returns a PNG (the format the name says) of the requested size in one
command, `Prefer: wait` returns a succeeded task in one call, and `dit download ID` fetches a
finished task's image later."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
from PIL import Image
import pytest

from client import Client
from tests.harness import ready_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

DIT = str(Path(sys.executable).with_name("dit"))


def test_dit_submit_wait_downloads_the_image_and_prefer_wait_answers_in_one_call(stack, tmp_path):
    stack.proc = stack.worker(nproc=1)
    ready_worker(stack, stack.proc)
    out = tmp_path / "x.png"
    run = subprocess.run([DIT, "--url", stack.url, "submit", "a lighthouse at dawn", "--size", "384x256",
                          "--wait", "--timeout", "120", "-o", str(out)],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "120"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out) and "succeeded" in run.stderr
    assert len(run.stderr.splitlines()) == 1  # piped: the result lines, no progress
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == (384, 256)

    one = httpx.post(f"{stack.url}/v1/tasks", json={"input": {"prompt": "a harbour", "width": 256, "height": 256}},
                     headers={"Prefer": "wait=60"}, timeout=90)
    assert one.status_code == 201 and one.headers["preference-applied"] == "wait=60"
    assert one.json()["status"] == "succeeded" and one.json()["result"]["width"] == 256

    with Client(stack.url) as dit:  # the library: submit and wait in one call, then the image
        task = dit.submit("a quiet bay", width=256, height=128, wait_s=60)
        assert task.status == "succeeded"
        path = dit.download(task, tmp_path / "bay.png")
        assert hashlib.sha256(path.read_bytes()).hexdigest() == task.result.sha256
        assert dit.download(task.id, tmp_path / "by-id.png").read_bytes() == path.read_bytes()

    again = subprocess.run([DIT, "--url", stack.url, "download", task.id, "-o", str(tmp_path / "again.png")],
                           capture_output=True, text=True, timeout=60)  # later, by id, from the command line
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()).read_bytes() == path.read_bytes()
