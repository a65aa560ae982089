"""Helpers for the hot path's tests: the same calls against the app with and without it, and their
answers compared once ids, tokens and times are made comparable."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.config import ApiConfig, Secrets
from scheduler.store import open_store

HEADERS = ("content-type", "content-length", "retry-after", "preference-applied", "www-authenticate")
_ID = re.compile(r"[0-9a-f]{12,}")


@contextmanager
def client(tmp_path, hot: bool, secrets: Secrets = Secrets(), **api) -> Iterator[TestClient]:
    store = open_store(str(tmp_path / f"hot-{hot}.db"), lease_ttl_s=60.0)
    app = create_app(store, ApiConfig(hot_path=hot, sweep_interval_s=3600, **api), secrets)
    with TestClient(app) as http:
        yield http


def comparable(resp) -> tuple:
    """Status, the headers that carry meaning, and the body with each id, token and time replaced by
    its order of first appearance (the two runs make different ids at different times)."""
    seen: dict[str, str] = {}

    def norm(value):
        if isinstance(value, dict):
            return {norm(k): norm(v) for k, v in value.items()}
        if isinstance(value, list):
            return [norm(v) for v in value]
        if isinstance(value, float):
            return "<time>"
        if isinstance(value, str):
            return _ID.sub(lambda m: seen.setdefault(m.group(), f"<id{len(seen)}>"), value)
        return value

    body = norm(resp.json()) if resp.content else None
    headers = {k: resp.headers[k] for k in HEADERS if k in resp.headers}
    if "content-length" in headers:  # its value follows the times' digits
        headers["content-length"] = "<present>"
    return resp.status_code, headers, body


def both(tmp_path, script: Callable[[TestClient], list], **kwargs) -> tuple[list, list]:
    """The script's answers with the hot path, then without."""
    out = []
    for hot in (True, False):
        with client(tmp_path, hot, **kwargs) as http:
            out.append([comparable(r) for r in script(http)])
    return out[0], out[1]
