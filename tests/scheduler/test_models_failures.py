"""Several models on one fleet, what is refused: a model the fleet does not serve (422 naming the
field and the fleet's models, nothing stored), a model named on a fleet of one model, an idempotency
key replayed with another model, and workers that name nothing usable."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.config import ApiConfig
from scheduler.store import SQLiteStore

REGISTRATION = {"hostname": "h", "world_size": 1, "devices": [], "version": "v"}


@pytest.fixture
def http(tmp_path):
    store = SQLiteStore(tmp_path / "s.db", models=["a", "b"])
    with TestClient(create_app(store, ApiConfig(sweep_interval_s=3600))) as client:
        yield client
    store.close()


def test_an_unknown_model_is_422_naming_the_field_and_the_fleets_models(http):
    one = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "model": "z"})
    batch = http.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "p"}, "model": "a"},
                                                         {"input": {"prompt": "p"}, "model": "z"}]})
    assert one.status_code == batch.status_code == 422
    assert one.json()["detail"] == "model: 'z' is not one of this fleet's models (a, b; GET /v1/models)"
    assert batch.json()["detail"].startswith("tasks[1]: model: 'z'")
    assert http.get("/v1/queue").json()["queued"] == 0  # the batch's first task was not stored either
    assert 'dit_scheduler_submissions_total{result="unknown_model"} 3.0' in http.get("/metrics").text


def test_a_model_that_is_no_model_id_is_422(http):
    resp = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "model": "a b"})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "model"]
    lease = http.post("/v1/workers/w-1/lease", json={"resident": ["../x"]})
    assert lease.status_code == 422 and lease.json()["detail"][0]["loc"][:2] == ["body", "resident"]


def test_a_model_named_on_a_fleet_of_one_model_is_422(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    with TestClient(create_app(store, ApiConfig(sweep_interval_s=3600))) as http:
        resp = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "model": "a"})
        models = http.get("/v1/models").json()
    assert resp.status_code == 422 and "models.ids is empty" in resp.json()["detail"]
    assert models == {"default": None, "cold_wait_s": 10.0, "models": {}}
    store.close()


def test_an_idempotency_key_replayed_with_another_model_is_409(http):
    first = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "model": "a", "idempotency_key": "k"})
    again = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "model": "b", "idempotency_key": "k"})
    default = http.post("/v1/tasks", json={"input": {"prompt": "p"}, "idempotency_key": "k"})  # the default is a
    assert (first.status_code, again.status_code, default.status_code) == (201, 409, 200)


def test_a_worker_that_names_no_model_of_the_fleet_gets_none_of_its_tasks(http):
    http.post("/v1/tasks", json={"input": {"prompt": "p"}})
    for model in ["", "black-forest-labs/FLUX.1-schnell"]:  # an older worker's name: not a model id
        wid = http.post("/v1/workers", json={**REGISTRATION, "model": model}).json()["worker_id"]
        assert http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).status_code == 204
    assert http.get("/v1/models").json()["models"]["a"]["queued"] == 1
