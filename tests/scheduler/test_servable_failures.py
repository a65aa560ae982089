"""Submissions no live worker could serve, refused over HTTP with a 422 naming the field (in process,
both backends): workers advertise their limits when they register."""

from __future__ import annotations

from fastapi.testclient import TestClient

from scheduler.__main__ import parse_args
from scheduler.app import create_app
from scheduler.config import ApiConfig, GateConfig
from tests.harness import REG

LIMITS = {"max_prompt_chars": 2000, "min_side": 64, "max_side": 1024, "size_multiple": 16, "max_pixels": 1024 * 1024,
          "default_width": 256, "default_height": 256, "max_steps": 8, "output_formats": ["png"]}
TOO_WIDE = {"prompt": "a harbour", "width": 1360}
WHY = "input.width: 1360 is above every live worker's limit (1024)"


def worker(http, limits=LIMITS) -> str:
    resp = http.post("/v1/workers", json={**REG, "limits": limits})
    assert resp.status_code == 201
    return resp.json()["worker_id"]


def test_an_input_no_live_worker_accepts_is_422_and_nothing_is_stored(make_store):
    with TestClient(create_app(make_store())) as http:
        wid = worker(http)
        # A worker that says nothing of images makes one a task (it predates num_images).
        assert http.get("/v1/workers").json()[0]["limits"] == {**LIMITS, "max_images": 1, "max_adapters": 0}
        refused = http.post("/v1/tasks", json={"input": TOO_WIDE})
        assert refused.status_code == 422 and refused.json()["detail"] == WHY
        batch = http.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "fits"}}, {"input": TOO_WIDE}]})
        assert batch.status_code == 422 and batch.json()["detail"] == f"tasks[1]: {WHY}"
        assert http.get("/v1/queue").json()["queued"] == 0  # the batch is refused whole
        assert "dit_scheduler_submissions_total{result=\"unservable\"} 3.0" in http.get("/metrics").text
        assert http.post("/v1/tasks", json={"input": {"prompt": "fits", "width": 1024}}).status_code == 201
        # A draining worker takes no new tasks: it no longer counts, and then no live worker is left.
        http.post(f"/v1/workers/{wid}/heartbeat", json={"status": "draining", "timestamp": 0})
        assert http.post("/v1/tasks", json={"input": TOO_WIDE}).status_code == 201


def test_without_a_live_worker_or_with_one_that_did_not_say_everything_is_accepted(make_store):
    with TestClient(create_app(make_store())) as http:
        assert http.post("/v1/tasks", json={"input": TOO_WIDE}).status_code == 201  # the fleet may start later
        worker(http)
        assert http.post("/v1/tasks", json={"input": TOO_WIDE}).status_code == 422
        worker(http, limits=None)  # an older worker, or another implementation: may serve anything
        assert http.post("/v1/tasks", json={"input": TOO_WIDE}).status_code == 201


def test_admit_unservable_switches_the_check_off(make_store):
    given = vars(parse_args(["--api-gate-admit-unservable"]))
    assert given["api.gate.admit_unservable"] and vars(parse_args([]))["api.gate.admit_unservable"] is None
    with TestClient(create_app(make_store(), ApiConfig(gate=GateConfig(admit_unservable=True)))) as http:
        worker(http)
        assert http.post("/v1/tasks", json={"input": TOO_WIDE}).status_code == 201


def test_more_images_than_any_live_worker_makes_is_422(make_store):
    with TestClient(create_app(make_store())) as http:
        worker(http, limits={**LIMITS, "max_images": 4})
        worker(http, limits={**LIMITS, "max_images": 2})
        refused = http.post("/v1/tasks", json={"input": {"prompt": "a harbour", "num_images": 5}})
        assert refused.status_code == 422
        assert refused.json()["detail"] == "input.num_images: 5 is above every live worker's limit (4)"
        assert http.post("/v1/tasks", json={"input": {"prompt": "a harbour", "num_images": 4}}).status_code == 201
