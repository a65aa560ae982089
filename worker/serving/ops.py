"""Rank 0's HTTP endpoint for operators, on a thread of its own (it never waits on the GPU):

    GET /metrics   Prometheus exposition (serving.metrics)
    GET /livez     200 while the serve loop makes progress (or loading is within its time); else 503
    GET /readyz    200 once warmed up, checks loaded and storage writable, until draining; else 503
    POST /profile?rounds=N   with `ops.profile_dir` set: a trace of the next N rounds (serving.profiling);
                   202 with where it will be written, 409 while one is under way, 400 for a bad N
    GET /profile   the trace's state

Both health answers are JSON: {"ok": bool, "reason": str}. It starts before the model loads, so
liveness is answered during a long load.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from protocol import RegistrationStatus
from worker.config import ConfigError
from worker.config.schema import OpsConfig
from worker.serving.metrics import Metrics
from worker.serving.profiling import MAX_ROUNDS, ProfileBusy, Profiler
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)


@dataclass
class Health:
    state: WorkerState
    stall_s: float  # deadlines.stall_s: a serve loop idle past it is stalled (the watchdog exits it)
    load_s: float  # distributed.load_timeout_s: loading and warm-up past it are stuck
    draining: Callable[[], bool]

    def live(self) -> tuple[bool, str]:
        idle = self.state.idle_s()
        if self.state.status == RegistrationStatus.INITIALIZING:
            return (idle <= self.load_s, f"loading for {idle:.0f}s (limit {self.load_s:.0f}s)")
        if idle > self.stall_s:
            return False, f"serve loop stalled: no finished turn for {idle:.0f}s (limit {self.stall_s:.0f}s)"
        return True, f"serve loop turned {idle:.1f}s ago"

    def ready(self) -> tuple[bool, str]:
        status = self.state.status
        if status == RegistrationStatus.INITIALIZING:
            return False, "loading and warming up"
        if self.draining() or status == RegistrationStatus.DRAINING:
            return False, "draining: no new work"
        if self.state.storage_failing:
            return False, "storage unavailable: the last store attempt failed"
        return True, "ready"


class OpsServer:
    def __init__(self, cfg: OpsConfig, metrics: Metrics, health: Health, profiler: Profiler | None = None) -> None:
        self._cfg = cfg
        self._profiler = profiler
        self._metrics_app = make_wsgi_app(metrics.registry)
        self._health = health
        self._server: ThreadingWSGIServer | None = None
        self.url = ""

    def start(self) -> str:
        """Listens (a busy port is a config error naming ops.port) and serves on a daemon thread."""
        try:
            self._server = make_server(self._cfg.host, self._cfg.port, self._app, ThreadingWSGIServer,
                                       handler_class=_QuietHandler)
        except OSError as e:
            raise ConfigError(f"ops.port: cannot listen on {self._cfg.host}:{self._cfg.port}: {e}") from e
        self._server.daemon_threads = True
        port = self._server.server_port
        host = self._cfg.host if self._cfg.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        self.url = f"http://{host}:{port}"
        threading.Thread(target=self._server.serve_forever, name="ops-http", daemon=True).start()
        log.info("metrics and health on %s (/metrics, /livez, /readyz)", self.url)
        return self.url

    def stop(self) -> None:
        """Called from the serve loop's thread as it ends: a trace under way is stopped and written."""
        if self._profiler is not None:
            self._profiler.finish()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics_app(environ, start_response)
        if path == "/profile" and self._profiler is not None:
            return self._profile(environ, start_response)
        probes = {"/livez": self._health.live, "/readyz": self._health.ready}
        if path not in probes:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: /metrics, /livez, /readyz" + (b", /profile" if self._profiler else b"") + b"\n"]
        ok, reason = probes[path]()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
        return [json.dumps({"ok": ok, "reason": reason}).encode()]

    def _profile(self, environ, start_response):
        def answer(status: str, body: dict):
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]

        assert self._profiler is not None
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "GET":
            return answer("200 OK", self._profiler.status())
        if method != "POST":
            return answer("405 Method Not Allowed", {"error": "GET or POST"})
        given = parse_qs(environ.get("QUERY_STRING", "")).get("rounds", ["8"])[0]
        try:
            rounds = int(given)
        except ValueError:
            return answer("400 Bad Request", {"error": f"rounds: {given!r} is not a whole number within 1..{MAX_ROUNDS}"})
        try:
            trace = self._profiler.request(rounds)
        except ValueError as e:  # out of range
            return answer("400 Bad Request", {"error": str(e)})
        except ProfileBusy as e:
            return answer("409 Conflict", {"error": str(e)})
        except OSError as e:  # ops.profile_dir cannot be made
            return answer("409 Conflict", {"error": f"ops.profile_dir: {e}"})
        log.info("profile armed: the next %d round(s) -> %s", rounds, trace)
        return answer("202 Accepted", {"trace": str(trace), "rounds": rounds})


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # a scrape every few seconds is not news
        pass
