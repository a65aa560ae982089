"""`dit` as users run it (a subprocess), against the real scheduler on 127.0.0.1 with no worker; where a
task must end, the test plays the worker over HTTP (`serve`)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from client import cli
from launch.local import free_port, start_scheduler, wait_until
from protocol import QueueFigures, TaskView, WorkerView
from tests.harness import Clock, register

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

DIT = str(Path(sys.executable).with_name("dit"))
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
TOP = "1000"  # the highest priority: what `serve` leases first is the test's own task


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    port = free_port()
    proc = start_scheduler(tmp / "s.db", port, tmp / "s.log")
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def env(url: str) -> dict:
    return {**os.environ, "DIT_URL": url, "COLUMNS": "120"}


def dit(url: str, *args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([DIT, *args], capture_output=True, text=True, timeout=timeout, env=env(url), cwd=cwd)


def serve(url: str, report: dict, wait_s: float = 0.0) -> str:
    """Plays a worker for one task: leases the first queued (waiting up to `wait_s` for one) and
    reports `report` on it. The task's id."""
    with httpx.Client(base_url=url, timeout=wait_s + 10) as http:
        wid = register(http)
        (lease,) = http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": wait_s}).json()["leases"]
        done = http.post(f"/v1/tasks/{lease['task_id']}/report",
                         json={"worker_id": wid, "lease_token": lease["lease_token"], **report})
        assert done.status_code == 200, done.text
        return lease["task_id"]


def made(tmp_path: Path, data: bytes = b"\x89PNG made by a test", uri: str | None = None) -> dict:
    """A succeeded report whose image is a file here (or `uri`, which may be nowhere)."""
    src = tmp_path / "made.png"
    src.write_bytes(data)
    return {"status": "succeeded", "result": {
        "uri": uri or src.as_uri(), "content_type": "image/png", "width": 384, "height": 256, "seed": 7,
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


REFUSED = {"status": "failed", "error": {"code": "unsafe_prompt", "message": "the prompt was refused",
                                         "retryable": False}}


def test_submit_status_and_cancel(url):
    sub = dit(url, "submit", "a lighthouse at dawn", "--size", "384x256", "--seed", "7")
    assert sub.returncode == 0, sub.stderr
    task_id = sub.stdout.strip()
    status = dit(url, "status", task_id)
    assert status.returncode == 0 and "queued" in status.stdout
    lines = dict(line.split(None, 1) for line in status.stdout.splitlines())  # piped: whole lines
    assert lines["id"] == task_id and lines["started_at"] == "-"
    assert (lines["model"], lines["size"], lines["prompt"], lines["attempts"]) == ("-", "384x256",
                                                                                   "a lighthouse at dawn", "0/3")
    assert re.fullmatch(ISO, lines["created_at"])
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


def test_a_wait_that_times_out_has_its_own_exit_status_and_says_how_to_resume(url):
    out = dit(url, "submit", "nobody serves this", "--wait", "--timeout", "1")
    assert out.returncode == 124  # not 1: the task has not failed, it goes on
    task_id = out.stderr.split()[2]
    error, hint = out.stderr.splitlines()  # piped: no progress, only what to read
    assert error == f"error: task {task_id} is still queued after 1s"
    assert f"`dit status {task_id}`" in hint and f"`dit download {task_id} --wait -o FILE`" in hint
    assert f"`dit cancel {task_id}`" in hint
    waited = dit(url, "status", task_id, "--wait-s", "0.5")
    assert waited.returncode == 124 and "queued" in waited.stdout


def test_an_output_file_means_waiting_for_it_in_the_format_its_name_says(url, tmp_path):
    out = dit(url, "submit", "nobody serves this", "-o", str(tmp_path / "f.png"), "--timeout", "1")
    assert out.returncode == 124 and "is still queued after 1s" in out.stderr  # waited, did not exit 0
    task_id = re.search(r"task (\w+) is still queued", out.stderr).group(1)
    assert httpx.get(f"{url}/v1/tasks/{task_id}").json()["input"]["output_format"] == "png"
    for name, fmt in (("f.JPG", "jpeg"), ("f.webp", "webp")):
        out = dit(url, "submit", "nobody serves this", "-o", str(tmp_path / name), "--timeout", "0.2")
        task_id = re.search(r"task (\w+) is still queued", out.stderr).group(1)
        assert httpx.get(f"{url}/v1/tasks/{task_id}").json()["input"]["output_format"] == fmt
    named = dit(url, "submit", "nobody serves this", "-o", str(tmp_path / "f.png"), "--format", "webp",
                "--timeout", "0.2")  # --format wins over the name
    task_id = re.search(r"task (\w+) is still queued", named.stderr).group(1)
    assert httpx.get(f"{url}/v1/tasks/{task_id}").json()["input"]["output_format"] == "webp"


def test_errors_name_what_to_do_and_set_the_exit_status(url):
    missing = dit(url, "status", "nope")
    assert missing.returncode == 4 and "check the id" in missing.stderr
    bad = dit(url, "submit", "x", "--size", "big")
    assert bad.returncode == 2 and "is not WIDTHxHEIGHT" in bad.stderr
    negative = dit(url, "submit", "x", "--size", "-16x512")  # not taken for an option: judged, and named
    assert negative.returncode == 2 and "'-16x512': width and height must be positive" in negative.stderr
    down = dit(f"http://127.0.0.1:{free_port()}", "--retry-deadline", "0.5", "status", "x")
    assert down.returncode == 3 and "is the scheduler running" in down.stderr


def test_watch_shows_the_queue_and_the_workers(url):
    dit(url, "submit", "waiting", "--priority", "3")
    out = dit(url, "watch", "--count", "1", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert "queued" in out.stdout and "p3: 1" in out.stdout and "workers" in out.stdout
    assert re.search(r"last minute \d+ succeeded, \d+ failed", out.stdout)  # labelled, not "17 / 7"


def test_every_exit_status_is_in_the_help():
    help_text = cli._parser().format_help()
    for code in cli.Exit:
        assert re.search(rf"^  {int(code)} +\S", help_text, re.M), code


def test_list_shows_one_whole_line_per_task_when_piped_and_json_for_scripts(url):
    prompt = "a very long prompt " * 12  # beyond the 120 columns a terminal would have
    ids = [dit(url, "submit", f"{prompt}{i}", "--size", "384x256", "--priority", "-7").stdout.strip()
           for i in range(2)]
    out = dit(url, "list", "--status", "queued", "--limit", "1000")
    assert out.returncode == 0, out.stderr
    assert not out.stdout.startswith("ID")  # piped: no header, every line a task
    rows = {line.split()[0]: line.split(None, 5) for line in out.stdout.splitlines()}
    for i, task_id in enumerate(ids):
        _, status, created, size, model, shown = rows[task_id]
        assert (status, size, model, shown) == ("queued", "384x256", "-", f"{prompt}{i}")
        assert re.fullmatch(ISO, created)
    first = dit(url, "list", "--limit", "1").stdout.splitlines()
    second = dit(url, "list", "--limit", "1", "--offset", "1").stdout.splitlines()
    assert len(first) == len(second) == 1 and first != second
    listed = json.loads(dit(url, "list", "--json", "--status", "queued", "--limit", "1000").stdout)
    assert {t["id"]: t["input"]["prompt"] for t in listed["tasks"]}[ids[1]] == f"{prompt}1"
    assert dit(url, "list", "--status", "lost").returncode == 2  # not a task status


def test_on_a_terminal_list_cuts_the_prompt_to_the_width():
    task = TaskView(**{**TASK, "input": {"prompt": "a lighthouse\nat dawn, " + "waves " * 30, "width": 384,
                                         "height": 256}})
    (whole,) = cli._list_lines([task], None)
    assert "a lighthouse at dawn, waves" in whole and whole.endswith("waves")  # one line, all of it
    header, cut = cli._list_lines([task], 80, header=True)
    assert header.split() == ["ID", "STATUS", "CREATED", "(UTC)", "SIZE", "MODEL", "PROMPT"]
    assert len(cut) == 80 and cut.endswith("…") and cut.index("a lighthouse") == header.index("PROMPT")
    assert " ".join(cut[:-1].split()) in " ".join(whole.split())  # the same columns, the prompt cut


def test_download_by_id_writes_the_image_or_says_why_not(url, tmp_path):
    report = made(tmp_path)
    task_id = dit(url, "submit", "to download", "--priority", TOP).stdout.strip()
    early = dit(url, "download", task_id)
    assert early.returncode == 124 and f"task {task_id} is still queued: it has no result yet" in early.stderr
    assert serve(url, report) == task_id
    got = dit(url, "download", task_id, cwd=tmp_path)  # ID.png, here
    assert got.returncode == 0 and got.stdout == f"{task_id}.png\n", got.stderr
    assert (tmp_path / f"{task_id}.png").read_bytes() == b"\x89PNG made by a test"
    named = dit(url, "download", task_id, "--wait", "-o", str(tmp_path / "sub" / "x.png"))  # ended: no wait
    assert named.returncode == 0 and (tmp_path / "sub" / "x.png").exists()

    refused = dit(url, "submit", "refused", "--priority", TOP).stdout.strip()
    serve(url, REFUSED)
    failed = dit(url, "download", refused)
    assert failed.returncode == 1 and f"task {refused} failed: unsafe_prompt: the prompt was refused" in failed.stderr
    elsewhere = dit(url, "submit", "stored elsewhere", "--priority", TOP).stdout.strip()
    serve(url, made(tmp_path, uri="file:///nowhere/x.png"))
    gone = dit(url, "download", elsewhere, "-o", str(tmp_path / "y.png"))
    assert gone.returncode == 5 and "is not on this machine" in gone.stderr
    unknown = dit(url, "download", "nope")
    assert unknown.returncode == 4 and "check the id" in unknown.stderr


def test_a_task_of_several_images_downloads_each_stored_one_and_names_the_withheld(url, tmp_path):
    srcs = []
    for i in (0, 2):
        srcs.append(tmp_path / f"made~{i}.png")
        srcs[-1].write_bytes(f"image {i}".encode())
    stored = [{"index": i, "seed": 7 + i, "uri": src.as_uri(), "content_type": "image/png",
               "bytes": src.stat().st_size, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}
              for i, src in zip((0, 2), srcs)]
    withheld = {"index": 1, "seed": 8, "withheld": {"code": "unsafe_image", "message": "image refused: nsfw 0.98",
                                                    "retryable": False}}
    report = {"status": "succeeded", "result": {**{k: stored[0][k] for k in ("uri", "content_type", "bytes", "sha256")},
                                                "width": 384, "height": 256, "seed": 7,
                                                "images": [stored[0], withheld, stored[1]]}}
    task_id = dit(url, "submit", "three boats", "--images", "3", "--seed", "7", "--priority", TOP).stdout.strip()
    with httpx.Client(base_url=url) as http:
        assert http.get(f"/v1/tasks/{task_id}").json()["input"]["num_images"] == 3
    assert serve(url, report) == task_id
    got = dit(url, "download", task_id, "-o", str(tmp_path / "out" / "boat.png"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == [str(tmp_path / "out" / "boat.png"), str(tmp_path / "out" / "boat~2.png")]
    assert (tmp_path / "out" / "boat~2.png").read_bytes() == b"image 2"
    assert not (tmp_path / "out" / "boat~1.png").exists()
    assert "image 1 (seed 8) withheld: image refused: nsfw 0.98" in got.stderr


@pytest.fixture
def empty_url(tmp_path):
    """A scheduler of its own, with nothing queued: the first task a lease gets is the one the test submits."""
    port = free_port()
    proc = start_scheduler(tmp_path / "empty.db", port, tmp_path / "empty.log")
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def test_piped_a_wait_prints_nothing_but_the_result_lines(empty_url, tmp_path):
    report = made(tmp_path)
    args = [DIT, "submit", "served while waiting", "--wait", "--timeout", "60"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env(empty_url)) as proc:
        try:
            task_id = serve(empty_url, report, wait_s=30)  # the lease waits for the submission
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert stdout == report["result"]["uri"] + "\n"
    assert re.fullmatch(rf"{task_id} succeeded in \d+\.\ds: 384x256, seed 7\n", stderr)


def test_on_a_terminal_a_wait_shows_the_state_the_position_and_how_to_get_a_worker(url, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=screen, force_terminal=True, width=200, soft_wrap=True))
    monkeypatch.setattr(cli, "HINT_AFTER_S", 0.0)  # no worker is ever ready here: the hint at once
    code = cli.main(["--url", url, "submit", "watched", "--priority", "5", "--wait", "--timeout", "0"])
    shown = screen.getvalue()
    assert code == cli.Exit.NOT_ENDED == 124
    assert re.search(r": queued · \d+s · position [\d-]+ of \d+ queued", shown), shown
    assert "no worker is ready" in shown and "start one with `make node` or check `dit watch`" in shown
    assert "is still queued after 0s" in shown  # the last state stays on screen above the error


TASK = {"id": "t1", "status": "queued", "input": {"prompt": "x"}, "priority": 0, "attempts": 0, "max_attempts": 3,
        "idempotency_key": "k", "worker_id": None, "result": None, "error": None, "created_at": 1.0,
        "updated_at": 1.0, "started_at": None, "finished_at": None}


def worker(status: str) -> WorkerView:
    return WorkerView(id="w", hostname="h", world_size=1, devices=[], model="m", version="v", status=status,
                      in_flight=[], registered_at=1.0, last_heartbeat=None)


def test_the_wait_view_counts_seconds_places_the_task_and_hints_only_when_nothing_can_serve_it():
    clock = Clock()
    view = cli.WaitView(TaskView(**TASK), clock)
    view.figures = QueueFigures(queued_by_priority={"5": 2, "0": 4, "-1": 1}, queued=7, oldest_queued_age_s=9.0,
                                running=0, ended_last_s={}, workers_by_status={})
    view.workers = [worker("initializing"), worker("lost")]
    clock.now += 4
    assert view.text() == "t1: queued · 4s · position 3-6 of 7 queued"  # 2 ahead for sure, 3 maybe
    clock.now += 1
    assert view.text().splitlines()[1] == ("no worker is ready (1 starting): start one with `make node` or "
                                           "check `dit watch`")
    view.workers = [worker("ready")]
    assert view.hint() is None
    view.task = TaskView(**{**TASK, "status": "processing", "worker_id": "w-1", "attempts": 2})
    view.workers = []
    assert view.text() == "t1: processing · 5s · worker w-1 · attempt 2 of 3"  # no hint: it is being served
    view.task = TaskView(**{**TASK, "priority": 5})
    assert view.text().startswith("t1: queued · 5s · position 1-2 of 7 queued")


def test_ctrl_c_while_waiting_says_which_task_goes_on(empty_url):
    proc = subprocess.Popen([DIT, "submit", "interrupted while waiting", "--wait"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(empty_url))
    try:
        with httpx.Client(base_url=empty_url) as http:
            wait_until(lambda: http.get("/v1/tasks").json()["tasks"], 30, "the task to be submitted")
            (task,) = http.get("/v1/tasks").json()["tasks"]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert f"interrupted: {task['id']} was submitted and goes on" in stderr and f"dit status {task['id']}" in stderr
