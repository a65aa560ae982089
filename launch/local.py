"""Running the scheduler and a torchrun worker as real local processes: for the demo, the
benchmarks and the tests.

A graceful stop signals only the process we started: torchrun forwards SIGTERM to each rank once.
A kill must reach every descendant, because torchrun starts each rank in a session of its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, proc: "Proc | None" = None, every_s: float = 0.1):
    """Polls `predicate` until it returns something true (returned), for at most `timeout` seconds.
    Fails at once, with the end of its log, if `proc` exits meanwhile."""
    def check():
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{' '.join(proc.args[:3])} exited ({proc.popen.returncode}) while waiting for {what}:\n"
                               f"{proc.output()[-4000:]}")
        return predicate()

    try:
        return Retrying(retry=retry_if_result(lambda v: not v), stop=stop_after_delay(timeout),
                        wait=wait_fixed(every_s))(check)
    except RetryError:
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from None


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


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

    def messages(self) -> str:
        """The log as an operator reads it: each JSON line's message (and traceback)."""
        return messages(self.output())


def messages(text: str) -> str:
    """Log output with JSON lines (telemetry.logs) turned into their messages; other lines as they are."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                pass
            else:
                out.append(record.get("msg", "") + ("\n" + record["exc"] if "exc" in record else ""))
                continue
        out.append(line)
    return "\n".join(out)


def start_scheduler(db: Path | str, port: int, log_path: Path, lease_ttl: float = 15.0,
                    max_attempts: int = 3, extra: list[str] = (), env: dict[str, str] | None = None,
                    cwd: Path = REPO) -> Proc:
    proc = Proc([sys.executable, "-m", "scheduler", "--database-url", str(db), "--server-port", str(port),
                 "--store-lease-ttl-s", str(lease_ttl), "--store-max-attempts", str(max_attempts), *extra],
                log_path, env=env, cwd=cwd)
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc


def wait_healthy(url: str, proc: Proc, timeout: float = 30.0) -> None:
    wait_until(lambda: answers(f"{url}/healthz"), timeout, f"the scheduler at {url}", proc)


def start_worker(config: Path, nproc: int, log_path: Path, overrides: list[str] = (),
                 max_restarts: int = 0, env: dict[str, str] | None = None, cwd: Path = REPO) -> Proc:
    """`torchrun --standalone --nproc_per_node=N -m worker --config ...` as users run it. Relative
    paths in the config resolve against `cwd`."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", "-m", "worker", "--config", str(config)]
    for item in overrides:
        args += ["--set", item]
    # One thread per rank: with 2 ranks on 2 cores, more threads each made generation 5-20x slower.
    return Proc(args, log_path, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}, cwd=cwd)
