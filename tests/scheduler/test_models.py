"""Several models on one fleet, on both stores and through the app: tasks name a model (or get the
default), workers say what they hold, a lease gives a worker tasks of one model it serves, routed to
warm workers first, and the queue's figures and metrics are per model."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from protocol import Heartbeat, RegisterWorker, SubmitTask, WorkerModels
from scheduler.app import create_app
from scheduler.config import ApiConfig
from tests.scheduler.test_store import ok

COLD = 10.0


def register(store, resident: list[str], loadable: list[str] = ()) -> str:
    return store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model=resident[0],
                                                 version="v", models=WorkerModels(resident=resident,
                                                                                  loadable=list(loadable))))[0]


def submit(store, model: str, n: int = 1) -> list[str]:
    return [store.tasks.submit(SubmitTask(input={"prompt": "p"}, model=model))[0].id for _ in range(n)]


@pytest.fixture
def fleet(make_store):
    return make_store(models=["a", "b", "c"], cold_wait_s=COLD)


def test_a_lease_holds_tasks_of_one_model_the_worker_holds(fleet):
    w = register(fleet, ["a"], ["b"])
    submit(fleet, "a", 2)
    submit(fleet, "c")  # it cannot serve c
    got = fleet.claims.claim(w, 8)
    assert [le.model for le in got] == ["a", "a"]
    assert fleet.claims.claim(w, 8) == []  # c is not its


def test_a_warm_worker_gets_its_model_and_a_cold_one_waits_cold_wait_for_it(fleet, clock):
    warm, cold = register(fleet, ["b"]), register(fleet, ["a"], ["b"])
    [task] = submit(fleet, "b")
    assert fleet.claims.claim(cold, 1) == []  # b has a warm worker: left to it
    clock.now += COLD
    [lease] = fleet.claims.claim(cold, 1)  # it waited cold_wait: the worker that must load it takes it
    assert (lease.task_id, lease.model) == (task, "b")
    assert fleet.tasks.get(task).model == "b"
    assert warm  # held b all along, and was busy


def test_a_model_nobody_holds_is_taken_at_once_and_its_taker_is_marked_warm(fleet):
    w = register(fleet, ["a"], ["b"])
    submit(fleet, "b")
    assert [le.model for le in fleet.claims.claim(w, 1)] == ["b"]
    assert {m: (f.warm_workers, f.loadable_workers) for m, f in fleet.tasks.models().items()} == \
        {"a": (1, 0), "b": (1, 0), "c": (0, 0)}


def test_what_a_lease_and_a_heartbeat_say_a_worker_holds_is_what_routes(fleet, clock):
    w = register(fleet, ["a"], ["b"])
    submit(fleet, "b")
    other = register(fleet, ["b"])  # b is warm elsewhere: left to it ...
    assert fleet.claims.claim(w, 1) == []
    [lease] = fleet.claims.claim(w, 1, resident=["b"])  # ... until this worker says it holds b too
    assert lease.model == "b"
    views = {v.id: v.models for v in fleet.workers.workers()}
    assert views[w] == WorkerModels(resident=["b"], loadable=["a"])
    fleet.workers.heartbeat(other, Heartbeat(status="ready", timestamp=clock.now,
                                             models=WorkerModels(resident=["c"], loadable=["b"])))
    assert {v.id: v.models for v in fleet.workers.workers()}[other] == WorkerModels(resident=["c"], loadable=["b"])


def test_per_model_figures(fleet, clock):
    w = register(fleet, ["a"], ["b"])
    submit(fleet, "a", 3)
    clock.now += 4
    submit(fleet, "b")
    [lease] = fleet.claims.claim(w, 1)
    fleet.reports.report(lease.task_id, ok(lease.lease_token, w))
    figures = fleet.tasks.figures().models
    assert (figures["a"].queued, figures["a"].oldest_queued_age_s, figures["a"].warm_workers) == (2, 4.0, 1)
    assert (figures["b"].queued, figures["b"].warm_workers, figures["b"].loadable_workers) == (1, 0, 1)
    assert figures["c"].queued == 0 and figures["c"].oldest_queued_age_s is None


def test_a_fleet_of_one_model_routes_nothing(make_store):
    store = make_store()
    w = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))[0]
    [task] = [store.tasks.submit(SubmitTask(input={"prompt": "p"}))[0]]
    [lease] = store.claims.claim(w, 1)
    assert (task.model, lease.model) == (None, None)
    assert store.tasks.figures().models == {}


def test_the_app_fills_the_default_lists_the_models_and_exports_them(tmp_path):
    from scheduler.store import SQLiteStore

    store = SQLiteStore(tmp_path / "s.db", models=["a", "b"], default_model="b")
    with TestClient(create_app(store, ApiConfig(sweep_interval_s=3600))) as http:
        made = http.post("/v1/tasks", json={"input": {"prompt": "p"}}).json()
        named = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "model": "a"}).json()
        listed = http.get("/v1/models").json()
        metrics = http.get("/metrics").text
    assert (made["model"], named["model"]) == ("b", "a")
    assert listed["default"] == "b" and set(listed["models"]) == {"a", "b"}
    assert listed["models"]["a"]["queued"] == 1
    assert 'dit_scheduler_model_queued{model="b"} 1.0' in metrics
    assert 'dit_scheduler_model_workers{model="a",state="warm"} 0.0' in metrics
    store.close()
