"""The scheduler's tests run on both backends: SQLite, and a real PostgreSQL server started once per
session (tests/conftest.py). `make_store` builds stores in-process with a fake clock; `server` is the
reference scheduler as a real process on 127.0.0.1, one per test module and backend."""

from __future__ import annotations

import httpx
import pytest

from launch.local import free_port, start_scheduler
from scheduler.store import SQLiteStore
from tests.harness import Clock

BACKENDS = ["sqlite", "postgres"]
# A store on PostgreSQL needs its server, a process: the integration tier (tests/tiers.py).
STORE_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture(params=STORE_BACKENDS)
def make_store(request, tmp_path, clock):
    made = []

    def make(location: str | None = None, **options):
        if request.param == "sqlite":
            store = SQLiteStore(location or tmp_path / f"s{len(made)}.db", clock=clock, **options)
        else:
            from scheduler.store.postgres import PostgresStore

            pg = request.getfixturevalue("postgres")
            store = PostgresStore(location or pg.fresh(), pool_size=8, clock=clock, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture(scope="module", params=BACKENDS)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sched")
    db = str(tmp / "s.db") if request.param == "sqlite" else request.getfixturevalue("postgres").fresh()
    port = free_port()
    proc = start_scheduler(db, port, tmp / "s.log", lease_ttl=1.0, max_attempts=3, extra=["--api-gate-max-queued", "50", "--api-waits-max-s", "3"])
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        yield http
    proc.stop()
