"""SQLite's one process marks every cancel of a held task, so an exchange's cancel notices read the
database only for tasks so marked: a mark survives a restart (read back at open), a task cancelled
is told either way, and the marks kept stay few (those ended are dropped once there are many)."""

from __future__ import annotations

import asyncio

from protocol import RegisterWorker, Report, SubmitTask
from scheduler.store import SQLiteStore
from scheduler.store import sqlite as sqlite_store


def held(store: SQLiteStore, n: int) -> tuple[str, list[str]]:
    wid, _ = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))
    for i in range(n):
        store.tasks.submit(SubmitTask(input={"prompt": f"held {i}"}))
    return wid, [le.task_id for le in store.claims.claim(wid, n)]


def notices(store: SQLiteStore, wid: str, ids: list[str]) -> list[str]:
    return asyncio.run(store.claims.acancelled_among(wid, ids))


def test_nothing_is_read_for_tasks_nobody_cancelled_and_a_cancel_is_told(tmp_path, monkeypatch):
    store = SQLiteStore(tmp_path / "s.db")
    wid, (a, b) = held(store, 2)

    async def no_read(plan):
        raise AssertionError("read for tasks nobody cancelled")

    with monkeypatch.context() as m:
        m.setattr(store, "_aread", no_read)
        assert notices(store, wid, [a, b]) == []
    store.reports.cancel(b)
    assert notices(store, wid, [a, b]) == [b]
    store.close()


def test_a_cancel_marked_before_a_restart_is_told_after_it(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    wid, (a, b) = held(store, 2)
    store.reports.cancel(a)
    store.close()
    again = SQLiteStore(tmp_path / "s.db")
    assert notices(again, wid, [a, b]) == [a]
    again.close()


def test_the_marks_kept_are_those_still_held_once_there_are_many(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "CANCELS_KEPT", 3)
    store = SQLiteStore(tmp_path / "s.db")
    wid, ids = held(store, 6)
    for task_id in ids[:3]:
        store.reports.cancel(task_id)
        store.reports.report_many([(task_id, _released(store, wid, task_id))])  # it ends
    store.reports.cancel(ids[3])
    store.reports.cancel(ids[4])  # over the limit: the ended are dropped
    assert store._cancels == {ids[3], ids[4]}
    assert notices(store, wid, ids[3:]) == sorted(ids[3:5])  # what its worker still holds
    store.close()


def _released(store: SQLiteStore, wid: str, task_id: str) -> Report:
    token = store._db.execute("SELECT lease_token FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]
    return Report(worker_id=wid, lease_token=token, status="failed",
                  error={"code": "cancelled", "message": "dropped", "retryable": False})
