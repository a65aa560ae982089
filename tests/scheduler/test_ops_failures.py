"""Scheduler health when its database does not answer: not ready (503, naming why), still alive."""

from __future__ import annotations

import asyncio

from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.config import ApiConfig


def test_not_ready_while_the_database_is_unreachable_or_too_slow(make_store):
    store = make_store()
    with TestClient(create_app(store, ApiConfig(ready_deadline_s=0.2))) as http:
        assert http.get("/readyz").status_code == 200

        def unreachable():
            raise ConnectionError("connection refused")
        store.ping = unreachable
        resp = http.get("/readyz")
        assert resp.status_code == 503
        assert resp.json() == {"ok": False, "reason": "database unreachable: ConnectionError: connection refused"}

        async def hangs():
            await asyncio.sleep(30)
        store.acall = lambda fn, *a: hangs()
        resp = http.get("/readyz")
        assert resp.status_code == 503 and "TimeoutError" in resp.json()["reason"]
        assert http.get("/livez").status_code == 200
