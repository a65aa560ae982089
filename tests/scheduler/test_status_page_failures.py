"""What the status page refuses: files outside the results roots, results that are not images,
unknown tasks, and a browser without a client token when auth is on."""

from __future__ import annotations

import base64

from fastapi.testclient import TestClient
from PIL import Image

from scheduler.app import create_app
from scheduler.config import ApiConfig, ResultsConfig, Secrets
from tests.harness import REG
from tests.scheduler.test_status_page import RESULT, finish


def test_thumbnails_only_for_image_files_under_the_results_roots(make_store, tmp_path):
    roots = tmp_path / "results"
    roots.mkdir()
    outside = tmp_path / "secret.png"
    Image.new("RGB", (32, 32)).save(outside)
    (roots / "not-an-image.png").write_text("hello")
    (roots / "link.png").symlink_to(outside)
    store = make_store()
    with TestClient(create_app(store, ApiConfig(results=ResultsConfig(roots=(roots.resolve(),))))) as http:
        wid = http.post("/v1/workers", json=REG).json()["worker_id"]
        ids = {name: finish(http, wid, "succeeded", result={**RESULT, "uri": uri}) for name, uri in {
            "outside": f"file://{outside}", "dotdot": f"file://{roots}/../secret.png",
            "symlink": f"file://{roots}/link.png", "broken": f"file://{roots}/not-an-image.png",
            "gcs": "gs://bucket/x.png"}.items()}
        failed = finish(http, wid, "failed", error={"code": "x", "message": "y", "retryable": False})
        for name, task_id in {**ids, "failed": failed, "unknown": "nope"}.items():
            resp = http.get(f"/status/thumbs/{task_id}.png")
            assert resp.status_code == 404, name
        assert "outside the results roots" in http.get(f"/status/thumbs/{ids['symlink']}.png").json()["detail"]


def test_with_client_tokens_the_page_asks_for_one(make_store):
    store = make_store()
    with TestClient(create_app(store, secrets=Secrets(client_tokens=frozenset({"s3cret"})))) as http:
        resp = http.get("/status")
        assert resp.status_code == 401 and resp.headers["www-authenticate"] == 'Basic realm="dit-scheduler"'
        wrong = base64.b64encode(b"ops:guess").decode()
        assert http.get("/status", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
        assert http.get("/status", headers={"Authorization": "Basic !!notbase64"}).status_code == 401
        right = base64.b64encode(b"anyone:s3cret").decode()
        assert http.get("/status", headers={"Authorization": f"Basic {right}"}).status_code == 200
        assert http.get("/status", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert http.get("/status/thumbs/x.png").status_code == 401
