"""The reference scheduler as a real server on 127.0.0.1, one per test module."""

from __future__ import annotations

import httpx
import pytest

from launch.local import free_port, start_scheduler


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sched")
    port = free_port()
    proc = start_scheduler(tmp / "s.db", port, tmp / "s.log", lease_ttl=1.0, max_attempts=3,
                           extra=["--max-queued", "50"])
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        yield http
    proc.stop()
