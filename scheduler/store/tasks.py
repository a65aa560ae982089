"""Submits and reads (base.Tasks). A submission is one transaction; reads never take the write lock."""

from __future__ import annotations

import json
import uuid
from typing import Any

from protocol import FINAL_STATUSES, ModelFigures, QueueFigures, SubmitTask, TaskView, adapter_set_key
from scheduler.store.base import Refused
from scheduler.store.database import Database, task_row
from scheduler.end_rate import END_RATE_MIN_TASKS, END_RATE_WINDOW_S, queue_wait_s
from scheduler.store.lifecycle import HELD, INITIAL, TAKING, status_in
from scheduler.store.plans import Plan, Read, Write


class SQLTasks:
    def __init__(self, store: Database) -> None:
        self._store = store

    def submit(self, req: SubmitTask) -> tuple[TaskView, bool]:
        """Returns (task, created). A repeated idempotency key returns the first task."""
        return self._store._run(self._submit(req, self._store.clock()))

    async def asubmit(self, req: SubmitTask) -> tuple[TaskView, bool]:
        """submit from the event loop: on PostgreSQL without a thread (psycopg's async pool), and
        announced to other processes together with the submits around it (_announce)."""
        view, created = await self._store._aintake(self._submit(req, self._store.clock(), announce=False))
        if created:
            self._store._announce(1)
        return view, created

    def submit_many(self, reqs: list[SubmitTask]) -> list[tuple[TaskView, bool]]:
        """Every task in one transaction: all are stored, or none (a Refused names the key)."""
        now = self._store.clock()
        with self._store._tx() as db:
            out = [self._store._run_in(db, self._submit(req, now, announce=False)) for req in reqs]
            self._store._notify(db, sum(created for _, created in out))
        return out

    def _submit(self, req: SubmitTask, now: float, announce: bool = True) -> Plan:
        """One INSERT that yields to an idempotency key already used (ON CONFLICT DO NOTHING): one
        round trip, its NOTIFY in the same statement on PostgreSQL; the first task read back when
        the key was taken. Two submits racing with one key: one inserts, the other reads it."""
        row = None
        for _ in range(2):  # the first task of a key expired and was removed between the two steps
            rows = yield Write(*self._insert(req, now, announce))
            if rows:
                return self._store.view(rows[0]), True
            row = next(iter((yield Read("SELECT * FROM tasks WHERE idempotency_key = ?", (req.idempotency_key,)))),
                       None)
            if row is not None:
                break
        if row is None:
            raise Refused(f"idempotency_key {req.idempotency_key!r} is being reused as its task is removed; retry")
        if json.loads(row["input"]) != req.input or row["priority"] != req.priority or row["model"] != req.model:
            raise Refused(f"idempotency_key {req.idempotency_key!r} was used with another body")
        return self._store.view(row), False

    def _insert(self, req: SubmitTask, now: float, announce: bool) -> tuple[str, tuple]:
        sql = ("INSERT INTO tasks (id, idempotency_key, input, priority, status, max_attempts, created_at, updated_at,"
               " webhook, model, adapters) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING"
               " RETURNING *")
        args = (uuid.uuid4().hex, req.idempotency_key, json.dumps(req.input, sort_keys=True), req.priority, INITIAL,
                req.max_attempts or self._store.max_attempts, now, now,
                req.webhook.model_dump_json() if req.webhook else None, req.model, adapter_set_key(req.input.get("loras")))
        return (self._store._announced(sql) if announce else sql), args

    def get(self, task_id: str) -> TaskView:
        return self._store.view(task_row(self._store._read(), task_id))

    def list(self, status: str | None, limit: int, offset: int) -> list[TaskView]:
        read = self._store._read()
        if status:
            rows = read.execute("SELECT * FROM tasks WHERE status = ? ORDER BY seq LIMIT ? OFFSET ?",
                                (status, limit, offset)).fetchall()
        else:
            rows = read.execute("SELECT * FROM tasks ORDER BY seq LIMIT ? OFFSET ?", (limit, offset)).fetchall()
        return [self._store.view(r) for r in rows]

    def ended_among(self, task_ids: list[str]) -> list[str]:
        """Those of `task_ids` that have reached a final state (one query)."""
        in_ids, ids = self._store._ids(task_ids)
        return [r["id"] for r in self._store._read().execute(
            f"SELECT id FROM tasks WHERE {in_ids} AND {status_in(FINAL_STATUSES)}", (ids,))]

    def ended_since(self, window_s: float) -> int:
        """Tasks that reached a final state within the last `window_s` (the recent pace)."""
        return self._store._read().execute("SELECT COUNT(*) AS n FROM tasks WHERE finished_at >= ?",
                                           (self._store.clock() - window_s,)).fetchone()["n"]

    def queued_count(self) -> int:
        return self._store._read().execute("SELECT COUNT(*) AS n FROM tasks WHERE status = 'queued'").fetchone()["n"]

    def queued_by_priority(self) -> dict[int, int]:
        return _queued_by_priority(self._store._read(), self._store.QUEUE_INDEX)

    def end_rate(self, window_s: float = END_RATE_WINDOW_S) -> float:
        return _end_rate(self._store._read(), self._store.clock(), window_s)

    def models(self) -> dict[str, ModelFigures]:
        return model_figures(self._store._read(), self._store.clock(), self._store.models)

    def figures(self) -> QueueFigures:
        read, now = self._store._read(), self._store.clock()
        figures = _figures(read, now, self._store.QUEUE_INDEX)
        figures.models = model_figures(read, now, self._store.models)
        return figures

    def recent(self, status: str, window_s: float, limit: int) -> list[TaskView]:
        """Tasks that ended in `status` within the last `window_s`, newest first (the status page)."""
        since = self._store.clock() - window_s
        rows = self._store._read().execute(
            "SELECT * FROM tasks WHERE finished_at >= ? AND status = ? ORDER BY finished_at DESC LIMIT ?",
            (since, status, limit)).fetchall()
        return [self._store.view(r) for r in rows]

    def history(self, window_s: float, bucket_s: int) -> list[dict]:
        """Per bucket of `bucket_s` over the last `window_s` and per final status: tasks ended, and
        their mean and longest time from submission to end. The bucket is a whole number (SQLite
        truncates and PostgreSQL rounds the cast: a task at a boundary may land in the next one)."""
        since = self._store.clock() - window_s
        return [dict(r) for r in self._store._read().execute(
            "SELECT CAST((finished_at - ?) / ? AS INTEGER) AS bucket, status, COUNT(*) AS n,"
            " AVG(finished_at - created_at) AS mean_s, MAX(finished_at - created_at) AS max_s"
            " FROM tasks WHERE finished_at >= ? GROUP BY bucket, status", (since, bucket_s, since)).fetchall()]


def _queued_by_priority(db: Any, queue_index: str) -> dict[int, int]:
    return {r["priority"]: r["n"] for r in db.execute(
        f"SELECT priority, COUNT(*) AS n FROM tasks{queue_index} WHERE status = 'queued' GROUP BY priority")}


def _end_rate(db: Any, now: float, window_s: float) -> float:
    """Tasks ended per second over the last `window_s`, measured from the first of them (a fleet that
    started within the window is not undercounted); 0 with fewer than END_RATE_MIN_TASKS to go by."""
    row = db.execute("SELECT COUNT(*) AS n, MIN(finished_at) AS first FROM tasks WHERE finished_at >= ?",
                     (now - window_s,)).fetchone()
    if row["n"] < END_RATE_MIN_TASKS:
        return 0.0
    return row["n"] / max(now - row["first"], 1.0)


def _figures(db: Any, now: float, queue_index: str) -> QueueFigures:
    queued = _queued_by_priority(db, queue_index)
    oldest = db.execute("SELECT MIN(created_at) AS t FROM tasks WHERE status = 'queued'").fetchone()["t"]
    running = db.execute(f"SELECT COUNT(*) AS n FROM tasks WHERE {status_in(HELD)}").fetchone()["n"]
    ended = {}
    for window in (60, 300, 900):
        counts = {r["status"]: r["n"] for r in db.execute(
            "SELECT status, COUNT(*) AS n FROM tasks WHERE finished_at >= ? GROUP BY status", (now - window,))}
        ended[str(window)] = {"succeeded": counts.get("succeeded", 0), "failed": counts.get("failed", 0)}
    workers = {r["status"]: r["n"] for r in db.execute("SELECT status, COUNT(*) AS n FROM workers GROUP BY status")}
    rate = _end_rate(db, now, END_RATE_WINDOW_S)
    waits = {str(p): round(w, 1) for p in queued if (w := queue_wait_s(queued, p, 0, rate)) is not None}
    return QueueFigures(queued_by_priority={str(p): n for p, n in queued.items()}, queued=sum(queued.values()),
                        oldest_queued_age_s=None if oldest is None else round(now - oldest, 3), running=running,
                        ended_last_s=ended, workers_by_status=workers, ended_per_s=round(rate, 2),
                        drain_per_s=round(rate, 2), wait_s_by_priority=waits)


def model_figures(db: Any, now: float, models: frozenset[str]) -> dict[str, ModelFigures]:
    """Per model of the fleet: its queue, what runs, and the live workers that hold it or can load it."""
    if not models:
        return {}
    queued = {r["model"]: r for r in db.execute(
        "SELECT model, COUNT(*) AS n, MIN(created_at) AS oldest FROM tasks WHERE status = 'queued'"
        " AND model IS NOT NULL GROUP BY model")}
    running = {r["model"]: r["n"] for r in db.execute(
        f"SELECT model, COUNT(*) AS n FROM tasks WHERE {status_in(HELD)} AND model IS NOT NULL GROUP BY model")}
    workers = {(r["model"], r["resident"]): r["n"] for r in db.execute(
        "SELECT wm.model, wm.resident, COUNT(*) AS n FROM worker_models wm JOIN workers w ON w.id = wm.worker_id"
        f" WHERE {status_in(TAKING, 'w.status')} GROUP BY wm.model, wm.resident")}
    out = {}
    for model in sorted(models):
        q = queued.get(model)
        out[model] = ModelFigures(queued=q["n"] if q else 0,
                                  oldest_queued_age_s=round(now - q["oldest"], 3) if q else None,
                                  running=running.get(model, 0), warm_workers=workers.get((model, 1), 0),
                                  loadable_workers=workers.get((model, 0), 0))
    return out
