"""Helpers the tests share: a stack of real local processes (scheduler + torchrun workers), a real
GCS emulator driven by the official client, and short ways to run tasks and watch workers."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import psutil

from bench.plain_client import PlainClient
from launch.local import REPO, Proc, free_port, start_scheduler, start_worker, wait_until
from bench.servers import start_gcs_emulator

TINY_CONFIG = REPO / "configs" / "tiny.toml"


def ci_size() -> bool:
    """`make test TEST_SIZE=ci` (.ci/run): the slowest suites run at a smaller size."""
    return os.environ.get("DIT_TEST_SIZE") == "ci"


class Clock:
    """An injected clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stack:
    """A real scheduler on 127.0.0.1 and the torchrun workers started against it."""

    def __init__(self, tmp: Path, model: Path, lease_ttl: float = 15.0, max_attempts: int = 3,
                 scheduler_args: list[str] = ()) -> None:
        self.tmp, self.model = tmp, model
        self.lease_ttl, self.max_attempts = lease_ttl, max_attempts
        self.scheduler_args = list(scheduler_args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.images = tmp / "images"
        self.workers: list[Proc] = []
        self.scheduler = self.start_scheduler()
        self.client = PlainClient(self.url)

    def start_scheduler(self) -> Proc:
        return start_scheduler(self.tmp / "scheduler.db", self.port, self.tmp / "scheduler.log",
                               lease_ttl=self.lease_ttl, max_attempts=self.max_attempts, extra=self.scheduler_args)

    def overrides(self, extra: list[str] = ()) -> list[str]:
        return [f"queue.url={self.url}", f"storage.local.root={self.images}", f"model.source={self.model}",
                # The policy lists alone check prompts: a text model would cost each worker 2 s of CPU
                # at start, and only tests/e2e/test_safety.py and test_observability.py need one.
                "queue.heartbeat_interval_s=1.0", "safety.text.backend=off",
                # Rank 0's /metrics and health on a free loopback port; the registration names it.
                "ops.host=127.0.0.1", "ops.port=0", *extra]

    def worker(self, nproc: int = 2, overrides: list[str] = (), max_restarts: int = 0,
               env: dict[str, str] | None = None) -> Proc:
        proc = start_worker(TINY_CONFIG, nproc, self.tmp / f"worker{len(self.workers)}.log",
                            self.overrides(overrides), max_restarts=max_restarts, env=env)
        self.workers.append(proc)
        return proc

    def node(self, nproc: int = 2, overrides: list[str] = (), env: dict[str, str] | None = None) -> Proc:
        """launch/node.sh as an operator runs it, with this environment's torchrun on PATH."""
        args = [str(REPO / "launch" / "node.sh")]
        for item in self.overrides(overrides):
            args += ["--set", item]
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        proc = Proc(args, self.tmp / f"node{len(self.workers)}.log", env={
            "CONFIG": str(TINY_CONFIG), "NPROC": str(nproc), "PATH": path, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.workers.append(proc)
        return proc

    def registered(self) -> list[dict]:
        return self.client.http.get("/v1/workers").json()

    def objects(self) -> list[Path]:
        """Stored objects, without in-progress temp files (dot files)."""
        return sorted(p for p in self.images.glob("*") if not p.name.startswith("."))

    def close(self) -> None:
        for w in self.workers:
            if w.alive():
                w.kill()
        if self.scheduler.alive():
            self.scheduler.stop()


def write_config(tmp_path: Path, text: str) -> Path:
    """A worker config file with `text` in it, for the loader to read."""
    path = tmp_path / "worker.toml"
    path.write_text(text)
    return path


def run(stack: Stack, inputs: list[dict], timeout: float = 120, proc: Proc | None = None) -> list[dict]:
    """Submits the inputs and waits for every task to end; the tasks, in input order."""
    ids = [stack.client.submit(i)["id"] for i in inputs]
    done = stack.client.wait(ids, timeout, proc=proc or stack.proc)
    return [done[i] for i in ids]


def ready_worker(stack: Stack, proc: Proc, known: int = 0) -> dict:
    """Waits until a worker beyond the first `known` registrations reports ready."""
    def find():
        fresh = stack.registered()[known:]
        return next((w for w in fresh if w["status"] == "ready"), None)

    return wait_until(find, 120, "a ready worker", proc)


def settled_worker(stack: Stack, beats: int = 2, timeout: float = 60) -> dict:
    """The ready worker's view after `beats` heartbeats sent from now on, so that it reflects the past."""
    seen: dict = {"last": None, "left": beats}

    def after_beats():
        workers = [w for w in stack.registered() if w["status"] != "initializing"]
        if not workers:
            return None
        (w,) = workers
        if w["last_heartbeat"] != seen["last"]:
            seen["last"], seen["left"] = w["last_heartbeat"], seen["left"] - 1
            if seen["left"] < 0:
                return w
        return None

    return wait_until(after_beats, timeout, f"{beats} heartbeats", every_s=0.2)


def rank_pid(torchrun: Proc, rank: int) -> int:
    for child in psutil.Process(torchrun.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no process for rank {rank}")


# ---------------------------------------------------------------- the scheduler's HTTP API

REG = {"hostname": "h", "world_size": 2, "devices": [{"name": "cpu", "memory_bytes": 1}], "model": "m",
       "version": "v"}


def register(http) -> str:
    resp = http.post("/v1/workers", json=REG)
    assert resp.status_code == 201
    return resp.json()["worker_id"]


def drain(http, wid):
    """Fails every queued task for good, so the shared server starts each test with an empty queue."""
    while (resp := http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 50})).status_code == 200:
        for lease in resp.json()["leases"]:
            http.post(f"/v1/tasks/{lease['task_id']}/report", json={
                "worker_id": wid, "lease_token": lease["lease_token"], "status": "failed",
                "error": {"code": "drained", "message": "test cleanup", "retryable": False}})


# ---------------------------------------------------------------- GCS

class Emulator:
    def __init__(self, log_dir: Path, persistent: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.root = log_dir / "gcs-data" if persistent else None  # objects survive a restart
        self.proc: Proc | None = None
        self.start()

    def start(self) -> None:
        if self.root:
            self.root.mkdir(parents=True, exist_ok=True)
        self.proc = start_gcs_emulator(self.port, self.log_dir / "gcs.log", self.root)

    def stop(self) -> None:
        if self.proc and self.proc.alive():
            self.proc.kill()

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = self.url  # read by the client when it is built
        return storage.Client(project="test", credentials=AnonymousCredentials())

    def bucket(self, name: str):
        client = self.client()
        bucket = client.bucket(name)
        if not bucket.exists():
            client.create_bucket(name)
        return client.bucket(name)


class HangingProxy:
    """A TCP proxy on 127.0.0.1 in front of a real server that can be made to hang: from `hang()` on,
    it swallows what clients send, on new and kept-alive connections alike, and never answers (a
    service that stopped responding without closing anything). `resume()` forwards again."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.hanging = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def hang(self) -> None:
        self.hanging.set()

    def resume(self) -> None:
        self.hanging.clear()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self.hanging.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ---------------------------------------------------------------- Prometheus

class Prometheus:
    """A real Prometheus server (Debian's package) on 127.0.0.1 scraping a scheduler every second and
    the workers it lists at GET /v1/workers/targets (HTTP service discovery), as in monitoring/."""

    def __init__(self, log_dir: Path, scheduler: str) -> None:
        import shutil

        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is missing: `make install` installs Debian's prometheus package")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        host = scheduler.removeprefix("http://")
        config = log_dir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: dit-scheduler\n    static_configs: [{{targets: ['{host}']}}]\n"
            f"  - job_name: dit-worker\n    http_sd_configs: [{{url: '{scheduler}/v1/workers/targets', refresh_interval: 1s}}]\n")
        self.proc = Proc([binary, f"--config.file={config}", f"--storage.tsdb.path={log_dir / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{self.port}"], log_dir / "prometheus.log")
        wait_until(lambda: _ok(f"{self.url}/-/ready"), 30, "Prometheus", self.proc)

    def query(self, expr: str) -> list[dict]:
        import httpx

        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.alive():
            self.proc.stop(10)


def _ok(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False
