"""Retention: an ended task carries `expires_at` and is removed after it (both backends, fake clock);
the scheduler deletes expired local results only when asked and only under the results roots."""

from __future__ import annotations

from pathlib import Path

from protocol import SubmitTask
from scheduler.api.background import remove_results
from scheduler.config import ApiConfig, ResultsConfig
from scheduler.store import Unknown
import pytest

from tests.scheduler.test_store import ok, submit, worker


def test_ended_tasks_expire_and_are_removed_queued_and_running_ones_never(make_store, clock):
    store = make_store(task_retention_s=3600)
    w = worker(store)
    done, running = submit(store, "done"), submit(store, "running")
    leases = {x.task_id: x for x in store.claims.claim(w, 2)}
    store.reports.report(done.id, ok(leases[done.id].lease_token, w))  # its result's uri is "u"
    queued = store.tasks.submit(SubmitTask(input={"prompt": "q"}))[0]
    ended = store.tasks.get(done.id)
    assert ended.expires_at == ended.finished_at + 3600
    assert store.tasks.get(running.id).expires_at is None and queued.expires_at is None
    clock.now += 3599
    assert store.upkeep.purge() == [] and store.tasks.get(done.id)
    clock.now += 2
    assert store.upkeep.purge() == ["u"]
    with pytest.raises(Unknown):
        store.tasks.get(done.id)
    assert store.tasks.get(running.id).status == "leased" and store.tasks.get(queued.id).status == "queued"


def test_expired_results_are_deleted_only_when_asked_and_only_under_the_roots(tmp_path):
    root = tmp_path / "results"
    root.mkdir()
    inside, outside = root / "a.png", tmp_path / "b.png"
    for p in (inside, outside):
        p.write_bytes(b"x")
    uris = [inside.as_uri(), outside.as_uri(), "gs://bucket/c.png"]
    remove_results(uris, ApiConfig(results=ResultsConfig(roots=(root.resolve(),))))
    assert inside.exists() and outside.exists()  # not asked
    remove_results(uris, ApiConfig(results=ResultsConfig(roots=(root.resolve(),), remove_expired=True)))
    assert not inside.exists() and outside.exists()
    assert Path(outside).read_bytes() == b"x"
