"""The HTTP app's shape: the same paths, methods and tags as before its routes moved into modules by
resource; routes get their services as typed dependencies, never from `app.state`; and the store's
errors become 404 and 409 in one place, with the store's message as `detail`."""

from __future__ import annotations

import ast
import inspect
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from launch.local import REPO
from scheduler.app import create_app
from scheduler.config import ApiConfig
from scheduler.store import Cancelled, Refused, Unknown

SCHEDULER = REPO / "scheduler"
ROUTES = ["tasks.py", "workers.py", "reports.py", "ops.py", "status.py"]

# (path, methods, tags) of every documented route, as the app had them before its routes were split by resource,
# and those added since (/v1/models).
BEFORE = [
    ("/v1/tasks", ["post", "get"], "clients"),
    ("/v1/tasks/batch", ["post"], "clients"),
    ("/v1/queue", ["get"], "clients"),
    ("/v1/models", ["get"], "clients"),
    ("/v1/tasks/{task_id}", ["get"], "clients"),
    ("/v1/tasks/{task_id}/cancel", ["post"], "clients"),
    ("/v1/workers", ["get", "post"], "workers"),
    ("/v1/workers/targets", ["get"], "workers"),
    ("/v1/workers/{worker_id}/lease", ["post"], "workers"),
    ("/v1/workers/{worker_id}/exchange", ["post"], "workers"),
    ("/v1/workers/{worker_id}/heartbeat", ["post"], "workers"),
    ("/v1/reports", ["post"], "workers"),
    ("/v1/tasks/{task_id}/report", ["post"], "workers"),
    ("/healthz", ["get"], "ops"),
    ("/livez", ["get"], "ops"),
    ("/readyz", ["get"], "ops"),
    ("/status", ["get"], "ops"),
    ("/status/thumbs/{task_id}.png", ["get"], "ops"),
]


def test_the_openapi_paths_methods_and_tags_are_those_of_before():
    paths = create_app(FakeStore()).openapi()["paths"]
    assert [(p, list(ops)) for p, ops in paths.items()] == [(p, m) for p, m, _ in BEFORE]
    for path, methods, tag in BEFORE:
        assert all(paths[path][m]["tags"] == [tag] for m in methods), path


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(SCHEDULER)): ast.parse(p.read_text(), str(p)) for p in sorted(SCHEDULER.rglob("*.py"))}


def attribute_chains(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, dotted name) of every `a.b.c` read, e.g. `request.app.state.store`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                out.append((node.lineno, ".".join([inner.id, *reversed(parts)])))
    return out


def test_no_module_uses_app_state():
    found = [(name, line, chain) for name, tree in modules().items() for line, chain in attribute_chains(tree)
             if ".app.state." in f".{chain}."]
    assert found == [], "services come from typed dependencies (scheduler/api/deps.py), not app.state"


@pytest.mark.parametrize("module", ROUTES)
def test_routes_read_no_request_state_and_map_no_store_error(module):
    tree = modules()[f"api/{module}"]
    assert not [c for _, c in attribute_chains(tree) if c.endswith(".state") or ".state." in c]
    raised = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
              and getattr(n.func, "id", "") == "HTTPException" and n.args
              and ast.unparse(n.args[0]) in ("404", "409")]
    assert raised == [], "the store's errors are answered by the app's handler (scheduler/api/errors.py)"


class FakeStore:
    """Just enough of a Store for the app to start; each role's calls raise what a test sets."""

    lease_ttl_s, inline, location = 60.0, True, "fake"
    models, default_model, cold_wait_s = frozenset(), None, 10.0

    def __init__(self, error: Exception | None = None) -> None:
        def fails(*args):
            raise error

        self.reclaimed = {}
        async def afails(*args):
            raise error

        self.tasks = SimpleNamespace(get=fails, submit=fails, asubmit=afails, queued_by_priority=dict,
                                     end_rate=lambda: 0.0)
        self.workers = SimpleNamespace(heartbeat=fails, fleet_limits=lambda: [])
        self.reports = SimpleNamespace(cancel=fails)

        self.claims = SimpleNamespace(aclaim=afails)

    async def aopen(self) -> None: ...

    async def aclose(self) -> None: ...

    async def acall(self, fn, *args):
        return fn(*args)


HEARTBEAT = {"status": "ready", "in_flight": [], "timestamp": 0.0}


@pytest.mark.parametrize("error, code", [
    (Unknown("no task t-1"), 404),
    (Refused("idempotency key k reused with another body"), 409),
    (Cancelled("t-1 was cancelled by a client"), 409),
])
@pytest.mark.parametrize("method, path, body", [
    ("GET", "/v1/tasks/t-1", None),
    ("POST", "/v1/tasks/t-1/cancel", None),
    ("POST", "/v1/tasks", {"input": {"prompt": "a"}}),
    ("POST", "/v1/workers/w-1/heartbeat", HEARTBEAT),
    ("POST", "/v1/workers/w-1/lease", {"max_tasks": 1}),
])
def test_a_store_error_from_any_route_is_one_status_with_the_stores_message(error, code, method, path, body):
    with TestClient(create_app(FakeStore(error), ApiConfig(sweep_interval_s=3600))) as http:
        resp = http.request(method, path, json=body)
    assert (resp.status_code, resp.json()) == (code, {"detail": str(error)})


def test_fastapis_own_opentelemetry_is_off_so_no_request_asks_for_providers():
    app = create_app(FakeStore())
    telemetry = getattr(app, "_native_telemetry", None)
    if "telemetry" not in inspect.signature(FastAPI).parameters:
        assert telemetry is None  # an older FastAPI (the pinned range allows it): nothing to switch off
        return
    assert telemetry is not None, "this FastAPI has native telemetry: the app must configure it"
    assert not any(telemetry.config[k] for k in ("tracing", "metrics", "logs"))
    assert not telemetry.enabled()
