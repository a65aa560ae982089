"""The store's rules in SQL, shared by both backends (sqlite.py, postgres.py), which supply the
connections, the transactions and a few dialect fragments. Statements are written with `?`
placeholders; the PostgreSQL backend adapts them.

- A claim is one UPDATE ... RETURNING over the queue's head (PostgreSQL: FOR UPDATE SKIP LOCKED,
  so concurrent claims from several scheduler processes never wait for, or take, each other's rows).
- A round's `processing` or `succeeded` reports are one UPDATE per task by its id, sent together
  (PostgreSQL: pipelined, one round trip).
- A heartbeat renews all of a worker's moving leases in one UPDATE.
- Expired leases, silent workers and old registrations are dealt with by `sweep` (maintenance, run
  periodically by the app), never inside a request; meanwhile a lease past its deadline is already
  refused to its holder (reports and renewals check the deadline).
- Reads never take the write lock.
- Held tasks taken back from their workers (expired lease, lost, replaced or drained worker) are
  logged at WARNING once their transaction has committed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from protocol import (
    CANCELLED_MARK,
    FINAL_STATUSES,
    ErrorCode,
    ErrorEnvelope,
    Heartbeat,
    HeartbeatReply,
    Lease,
    QueueFigures,
    RegisterWorker,
    Report,
    SubmitTask,
    TaskView,
    WebhookAttempt,
    WorkerLimits,
    WorkerView,
)
from scheduler import leases
from scheduler.store.base import Cancelled, Conflict, NotFound, task_view, worker_view

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Write:
    """A plan's step: one statement that is atomic on its own; its RETURNING rows come back."""
    sql: str
    args: tuple


@dataclass(frozen=True)
class WriteEach:
    """A plan's step: one statement per set of arguments, each atomic on its own, sent together
    (PostgreSQL: one pipelined round trip); the RETURNING rows of all of them come back."""
    sql: str
    args: list[tuple]


@dataclass(frozen=True)
class Read:
    """A plan's step: one read; its rows come back."""
    sql: str
    args: tuple


# The hot paths (claim, a round's reports) are written once as plans: generators that yield their
# statements and receive the rows. `_run` carries them out on blocking connections (tests, tools,
# SQLite); `_arun` on the event loop, with PostgreSQL without a thread (psycopg's async pool).
Plan = Generator[Write | WriteEach | Read, list, Any]

HELD = "status IN ('leased', 'processing')"
# Registrations that can take tasks: the fleet whose limits decide what a submission may ask for.
TAKING = "status IN ('initializing', 'ready')"
# Registrations that send no more heartbeats: never made `lost`, pruned after the retention.
CLOSED = "('lost', 'replaced', 'drained')"
# Set in the same UPDATE as a final status (or the start), so a webhook event is never lost: due at
# once (0); the dispatcher (scheduler/webhooks.py) claims it, delivers, and records the attempt.
WEBHOOK_ENDED = "webhook_due = CASE WHEN webhook IS NULL THEN NULL ELSE 0 END"
# {wants}: the dialect's "the webhook asks for the started event" (no %: psycopg reads it as a placeholder).
WEBHOOK_STARTED = "webhook_due = CASE WHEN {wants} AND started_at IS NULL THEN 0 ELSE webhook_due END"
HELD_ROW = "id, attempts, max_attempts, error, worker_id, cancel_requested_at"
ENDED = "status IN ({})".format(", ".join(f"'{s}'" for s in FINAL_STATUSES))
# A task ending `cancelled`; parameters: the error, then now three times.
CANCEL_SET = ("status = 'cancelled', error = ?, lease_token = NULL, lease_deadline = NULL,"
              " cancel_requested_at = COALESCE(cancel_requested_at, ?), updated_at = ?, finished_at = ?,"
              f" {WEBHOOK_ENDED}")


class SQLStore:
    """Subclasses provide `_tx()` (a write transaction yielding a handle with `execute(sql, args)`),
    `_read()` (a read handle), and the dialect fragments below."""

    TOKEN_SQL = ""  # an expression making a fresh random lease token per row
    SKIP_LOCKED = ""  # appended to the claim's inner SELECT
    LOCK_ROW = ""  # appended to a SELECT of a row about to change
    GREATEST = "MAX"  # the two-argument maximum
    WANTS_STARTED = "instr(webhook, '\"started\"') > 0"  # the webhook asks for the started event
    inline = False  # True: in-process and short, called on the app's event loop instead of a thread

    def __init__(self, *, lease_ttl_s: float = 60.0, max_attempts: int = 3, liveness_s: float = 90.0,
                 retention_s: float = 86400.0, task_retention_s: float = 7 * 86400.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.max_attempts = max_attempts
        self.liveness_s = liveness_s  # a worker silent this long is lost; its tasks go back
        self.retention_s = retention_s  # lost and replaced registrations are kept this long
        self.task_retention_s = task_retention_s  # ended tasks are kept this long (expires_at), then removed
        self._clock = clock
        self._webhook_started = WEBHOOK_STARTED.format(wants=self.WANTS_STARTED)
        # Held tasks this process took back, by (reason code, "queued" or "failed"): for /metrics.
        self.reclaimed: Counter[tuple[str, str]] = Counter()
        self._reclaimed_lock = threading.Lock()

    def _view(self, row: Any) -> TaskView:
        return task_view(row, self.task_retention_s)

    # ------------------------------------------------------------ backend hooks

    def _tx(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _read(self) -> Any:
        raise NotImplementedError

    def _stmt(self) -> AbstractContextManager[Any]:
        """A handle for one statement that is atomic on its own. PostgreSQL: outside a transaction
        block, so BEGIN and COMMIT cost no round trips."""
        return self._tx()

    def _ids(self, ids: list[str]) -> tuple[str, Any]:
        """A condition `id` in `ids`, and its one parameter."""
        raise NotImplementedError

    def _notify(self, db: Any, n: int) -> None:
        """Tells other scheduler processes that n tasks may be waiting (at commit)."""

    def _maintenance_lock(self, db: Any) -> bool:
        """False when another process is running maintenance right now."""
        return True

    async def aopen(self) -> None:
        """Opens what the async calls need, on the app's event loop."""

    async def aclose(self) -> None:
        pass

    # ------------------------------------------------------------ plans

    def _run(self, plan: Plan) -> Any:
        try:
            step = next(plan)
            while True:
                if isinstance(step, Write):
                    with self._stmt() as db:
                        rows = db.execute(step.sql, step.args).fetchall()
                elif isinstance(step, WriteEach):
                    with self._stmt() as db:
                        rows = self._each(db, step.sql, step.args)
                else:
                    rows = self._read().execute(step.sql, step.args).fetchall()
                step = plan.send(rows)
        except StopIteration as done:
            return done.value

    def _each(self, db: Any, sql: str, args: list[tuple]) -> list:
        return [row for one in args for row in db.execute(sql, one).fetchall()]

    async def _arun(self, plan: Plan) -> Any:
        return await self.acall(self._run, plan)

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One of this store's blocking calls, from the event loop: made there when `inline`
        (SQLite: in-process and short, cheaper than two thread hand-offs), else on a thread."""
        if self.inline:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    # ------------------------------------------------------------ clients

    def submit(self, req: SubmitTask) -> tuple[TaskView, bool]:
        """Returns (task, created). A repeated idempotency key returns the first task."""
        [(view, created)] = self.submit_many([req])
        return view, created

    def submit_many(self, reqs: list[SubmitTask]) -> list[tuple[TaskView, bool]]:
        """Every task in one transaction: all are stored, or none (a Conflict names the key)."""
        now = self._clock()
        out = []
        with self._tx() as db:
            for req in reqs:
                out.append(self._insert(db, req, now))
            self._notify(db, sum(created for _, created in out))
        return out

    def _insert(self, db: Any, req: SubmitTask, now: float) -> tuple[TaskView, bool]:
        if req.idempotency_key is not None:
            row = db.execute("SELECT * FROM tasks WHERE idempotency_key = ?", (req.idempotency_key,)).fetchone()
            if row is not None:
                if json.loads(row["input"]) != req.input or row["priority"] != req.priority:
                    raise Conflict(f"idempotency_key {req.idempotency_key!r} was used with another body")
                return self._view(row), False
        row = db.execute(
            "INSERT INTO tasks (id, idempotency_key, input, priority, status, max_attempts,"
            " created_at, updated_at, webhook) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?) RETURNING *",
            (uuid.uuid4().hex, req.idempotency_key, json.dumps(req.input, sort_keys=True), req.priority,
             req.max_attempts or self.max_attempts, now, now,
             req.webhook.model_dump_json() if req.webhook else None)).fetchone()
        return self._view(row), True

    def get(self, task_id: str) -> TaskView:
        return self._view(_get(self._read(), task_id))

    def list(self, status: str | None, limit: int, offset: int) -> list[TaskView]:
        if status:
            rows = self._read().execute("SELECT * FROM tasks WHERE status = ? ORDER BY seq LIMIT ? OFFSET ?",
                                        (status, limit, offset)).fetchall()
        else:
            rows = self._read().execute("SELECT * FROM tasks ORDER BY seq LIMIT ? OFFSET ?", (limit, offset)).fetchall()
        return [self._view(r) for r in rows]

    def ping(self) -> None:
        """One round trip to the database: raises when it cannot be reached."""
        self._read().execute("SELECT 1 AS one").fetchone()

    def ended_among(self, task_ids: list[str]) -> list[str]:
        """Those of `task_ids` that have reached a final state (one query)."""
        in_ids, ids = self._ids(task_ids)
        return [r["id"] for r in self._read().execute(
            f"SELECT id FROM tasks WHERE {in_ids} AND {ENDED}", (ids,))]

    def ended_since(self, window_s: float) -> int:
        """Tasks that reached a final state within the last `window_s` (the recent pace)."""
        return self._read().execute("SELECT COUNT(*) AS n FROM tasks WHERE finished_at >= ?",
                                    (self._clock() - window_s,)).fetchone()["n"]

    def queued_count(self) -> int:
        return self._read().execute("SELECT COUNT(*) AS n FROM tasks WHERE status = 'queued'").fetchone()["n"]

    def figures(self) -> QueueFigures:
        now = self._clock()
        db = self._read()
        by_priority = {str(r["priority"]): r["n"] for r in db.execute(
            "SELECT priority, COUNT(*) AS n FROM tasks WHERE status = 'queued' GROUP BY priority")}
        oldest = db.execute("SELECT MIN(created_at) AS t FROM tasks WHERE status = 'queued'").fetchone()["t"]
        running = db.execute(f"SELECT COUNT(*) AS n FROM tasks WHERE {HELD}").fetchone()["n"]
        ended = {}
        for window in (60, 300, 900):
            counts = {r["status"]: r["n"] for r in db.execute(
                "SELECT status, COUNT(*) AS n FROM tasks WHERE finished_at >= ? GROUP BY status", (now - window,))}
            ended[str(window)] = {"succeeded": counts.get("succeeded", 0), "failed": counts.get("failed", 0)}
        workers = {r["status"]: r["n"] for r in db.execute("SELECT status, COUNT(*) AS n FROM workers GROUP BY status")}
        return QueueFigures(queued_by_priority=by_priority, queued=sum(by_priority.values()),
                            oldest_queued_age_s=None if oldest is None else round(now - oldest, 3), running=running,
                            ended_last_s=ended, workers_by_status=workers)

    def recent(self, status: str, window_s: float, limit: int) -> list[TaskView]:
        """Tasks that ended in `status` within the last `window_s`, newest first (the status page)."""
        since = self._clock() - window_s
        rows = self._read().execute(
            "SELECT * FROM tasks WHERE finished_at >= ? AND status = ? ORDER BY finished_at DESC LIMIT ?",
            (since, status, limit)).fetchall()
        return [self._view(r) for r in rows]

    def history(self, window_s: float, bucket_s: int) -> list[dict]:
        """Per bucket of `bucket_s` over the last `window_s` and per final status: tasks ended, and
        their mean and longest time from submission to end. The bucket is a whole number (SQLite
        truncates and PostgreSQL rounds the cast: a task at a boundary may land in the next one)."""
        since = self._clock() - window_s
        return [dict(r) for r in self._read().execute(
            "SELECT CAST((finished_at - ?) / ? AS INTEGER) AS bucket, status, COUNT(*) AS n,"
            " AVG(finished_at - created_at) AS mean_s, MAX(finished_at - created_at) AS max_s"
            " FROM tasks WHERE finished_at >= ? GROUP BY bucket, status", (since, bucket_s, since)).fetchall()]

    # ------------------------------------------------------------ workers

    def register(self, req: RegisterWorker) -> tuple[str, int]:
        """(worker id, tasks requeued). A registration naming a node replaces that node's earlier
        registrations: their group restarted, so the tasks they held go back now, not at lease expiry."""
        worker_id = f"w-{uuid.uuid4().hex[:12]}"
        now = self._clock()
        with self._tx() as db:
            db.execute("INSERT INTO workers (id, info, status, registered_at, node_id, limits)"
                       " VALUES (?, ?, 'initializing', ?, ?, ?)",
                       (worker_id, req.model_dump_json(exclude={"node_id", "limits"}), now, req.node_id,
                        req.limits.model_dump_json() if req.limits else None))
            taken = self._replace(db, req.node_id, worker_id, now) if req.node_id else []
            self._notify(db, len(taken))
        _log_reclaimed(taken)
        return worker_id, len(taken)

    def workers(self) -> list[WorkerView]:
        rows = self._read().execute("SELECT * FROM workers ORDER BY registered_at").fetchall()
        now = self._clock()
        return [worker_view(r, now) for r in rows]

    def fleet_limits(self) -> list[WorkerLimits | None]:
        """The distinct limits of the workers that can take tasks (one row per kind of worker, however
        many there are); None for workers that advertised none."""
        rows = self._read().execute(f"SELECT DISTINCT limits FROM workers WHERE {TAKING}").fetchall()
        return [_limits(r["limits"]) if r["limits"] else None for r in rows]

    def claim(self, worker_id: str, max_tasks: int) -> list[Lease]:
        return self._run(self._claim(worker_id, max_tasks))

    async def aclaim(self, worker_id: str, max_tasks: int) -> list[Lease]:
        return await self._arun(self._claim(worker_id, max_tasks))

    def _claim(self, worker_id: str, max_tasks: int) -> Plan:
        """Atomically lease up to `max_tasks` queued tasks, highest priority first, then FIFO: one
        UPDATE ... RETURNING, one round trip. Tokens are fresh random values made by the database
        (fencing tokens: a report also needs the worker's id and bearer token)."""
        now = self._clock()
        deadline = leases.deadline(now, self.lease_ttl_s)
        rows = yield Write(
            f"UPDATE tasks SET status = 'leased', attempts = attempts + 1, worker_id = ?,"
            f" lease_token = {self.TOKEN_SQL}, lease_deadline = ?, updated_at = ?"
            f" WHERE id IN (SELECT id FROM tasks WHERE status = 'queued' ORDER BY priority DESC, seq LIMIT ?"
            f"{self.SKIP_LOCKED}) AND EXISTS (SELECT 1 FROM workers WHERE id = ? AND status != 'drained')"
            f" RETURNING id, input, created_at, lease_token, attempts, priority, seq",
            (worker_id, deadline, now, max_tasks, worker_id))
        if not rows:
            _check_registration((yield Read("SELECT status FROM workers WHERE id = ?", (worker_id,))), worker_id)
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        return [Lease(task_id=r["id"], input=json.loads(r["input"]), created_at=r["created_at"],
                      lease_token=r["lease_token"], lease_deadline=deadline, lease_ttl_s=self.lease_ttl_s,
                      attempt=r["attempts"]) for r in rows]

    def heartbeat(self, worker_id: str, hb: Heartbeat) -> HeartbeatReply:
        """Records the worker's state and renews, in one UPDATE, the leases it still holds on its
        in-flight tasks; the others are `lost`."""
        now = self._clock()
        if hb.status == "drained":
            return self._drained(worker_id, hb, now)
        deadline = leases.deadline(now, self.lease_ttl_s)
        in_ids, ids = self._ids(hb.in_flight)
        with self._tx() as db:
            _require_worker(db, worker_id)
            # A replaced registration stays replaced: its group is gone or about to be.
            db.execute("UPDATE workers SET status = CASE WHEN status = 'replaced' THEN status ELSE ? END,"
                       " in_flight = ?, last_heartbeat = ?, warnings = ?, counters = ?, safety_policy = ? WHERE id = ?",
                       (hb.status, json.dumps(hb.in_flight), now, json.dumps(hb.warnings), json.dumps(hb.counters),
                        hb.safety_policy, worker_id))
            rows = db.execute(
                f"UPDATE tasks SET lease_deadline = ?, updated_at = ? WHERE worker_id = ? AND {HELD}"
                f" AND lease_deadline >= ? AND {in_ids} RETURNING id, cancel_requested_at",
                (deadline, now, worker_id, now, ids)).fetchall()
        renewed = {r["id"] for r in rows}
        return HeartbeatReply(renewed={t: deadline for t in hb.in_flight if t in renewed},
                              lost=[t for t in hb.in_flight if t not in renewed],
                              cancelled=sorted(r["id"] for r in rows if r["cancel_requested_at"] is not None))

    def _drained(self, worker_id: str, hb: Heartbeat, now: float) -> HeartbeatReply:
        """A drain's last heartbeat: the worker is leaving on purpose, so its registration ends
        `drained` (never `lost`; a replaced one stays replaced) and is refused for leases and
        heartbeats from now on. A clean drain holds nothing; whatever it still holds goes back now."""
        with self._tx() as db:
            _require_worker(db, worker_id)
            db.execute("UPDATE workers SET status = CASE WHEN status = 'replaced' THEN status ELSE 'drained' END,"
                       " in_flight = '[]', last_heartbeat = ?, warnings = ?, counters = ?, safety_policy = ? WHERE id = ?",
                       (now, json.dumps(hb.warnings), json.dumps(hb.counters), hb.safety_policy, worker_id))
            taken = self._take_back(db, worker_id, ErrorCode.WORKER_DRAINED,
                                    f"worker {worker_id} drained while holding it", now)
            self._notify(db, len(taken))
        _log_reclaimed(taken)
        return HeartbeatReply(renewed={}, lost=list(hb.in_flight))

    def report(self, task_id: str, rep: Report) -> TaskView:
        """Applies a worker's report if, and only if, it carries the task's current, unexpired lease."""
        return _raised(self.report_many([(task_id, rep)])[0])

    def cancel(self, task_id: str) -> TaskView:
        now = self._clock()
        with self._tx() as db:
            row = _get(db, task_id, self.LOCK_ROW)
            if row["status"] in FINAL_STATUSES:
                raise Conflict(f"task {task_id} has already ended ({row['status']}); nothing to cancel")
            if row["status"] == "queued":  # not leased: it ends now and is never leased
                row = self._end_cancelled(db, task_id, now, "while queued")
            else:
                row = db.execute("UPDATE tasks SET cancel_requested_at = COALESCE(cancel_requested_at, ?),"
                                 " updated_at = ? WHERE id = ? RETURNING *", (now, now, task_id)).fetchone()
        return self._view(row)

    @staticmethod
    def _end_cancelled(db: Any, task_id: str, now: float, why: str) -> Any:
        return db.execute(f"UPDATE tasks SET {CANCEL_SET} WHERE id = ? RETURNING *",
                          (_cancel_error(why), now, now, now, task_id)).fetchone()

    async def areport(self, task_id: str, rep: Report) -> TaskView:
        return _raised((await self.areport_many([(task_id, rep)]))[0])

    def report_many(self, items: list[tuple[str, Report]]) -> list[TaskView | NotFound | Conflict]:
        """Several reports, each applied on its own and atomically: a refused one (NotFound, Conflict,
        returned in its place) changes nothing and does not stop the others."""
        if _alike(items):
            return self._run(self._report_alike(items))
        return self._report_each(items)

    async def areport_many(self, items: list[tuple[str, Report]]) -> list[TaskView | NotFound | Conflict]:
        if _alike(items):
            return await self._arun(self._report_alike(items))
        return await self.acall(self._report_each, items)

    def _report_each(self, items: list[tuple[str, Report]]) -> list[TaskView | NotFound | Conflict]:
        now = self._clock()
        out: list[TaskView | NotFound | Conflict] = []
        with self._tx() as db:
            for task_id, rep in items:
                try:
                    out.append(self._view(self._apply(db, task_id, rep, now)))
                except (NotFound, Conflict) as e:  # raised before anything is written
                    out.append(e)
        return out

    def _report_alike(self, items: list[tuple[str, Report]]) -> Plan:
        """`processing` or `succeeded` reports of distinct tasks (a round's): one UPDATE per task by
        its id, sent together, each changing its row only if the report carries the current,
        unexpired lease; the refused ones are told apart afterwards by a read. Tokens are compared
        in SQL, not in constant time: they are 122+ random bits, and a report also needs the
        worker's bearer token."""
        now = self._clock()
        held_by = ("WHERE id = ? AND lease_token = ? AND worker_id = ? AND status IN ('leased', 'processing')"
                   " AND lease_deadline >= ?")
        fence = f"{held_by} AND cancel_requested_at IS NULL RETURNING *"
        if items[0][1].status == "processing":
            deadline = leases.deadline(now, self.lease_ttl_s)
            sql = (f"UPDATE tasks SET status = 'processing', lease_deadline = ?, updated_at = ?, {self._webhook_started},"
                   f" started_at = COALESCE(started_at, ?) {fence}")
            args = [(deadline, now, now, task_id, rep.lease_token, rep.worker_id, now) for task_id, rep in items]
        else:
            sql = ("UPDATE tasks SET status = 'succeeded', result = ?, error = NULL, lease_token = NULL,"
                   f" lease_deadline = NULL, updated_at = ?, finished_at = ?, {WEBHOOK_ENDED} {fence}")
            args = [(rep.result.model_dump_json(), now, now, task_id, rep.lease_token, rep.worker_id, now)
                    for task_id, rep in items]
        changed = {r["id"]: r for r in (yield WriteEach(sql, args))}
        out: list[TaskView | NotFound | Conflict] = []
        for task_id, rep in items:
            if task_id in changed:
                out.append(self._view(changed[task_id]))
                continue
            found = yield Read("SELECT status, cancel_requested_at FROM tasks WHERE id = ?", (task_id,))
            if not found:
                out.append(NotFound(f"no task {task_id}"))
            elif found[0]["cancel_requested_at"] is not None and (yield Write(  # cancelled: it ends here
                    f"UPDATE tasks SET {CANCEL_SET} {held_by} RETURNING id",
                    (_cancel_error(_worker_said(rep)), now, now, now, task_id, rep.lease_token, rep.worker_id, now))):
                out.append(_cancelled(task_id, rep.status))
            else:
                out.append(_not_held(task_id, found[0]["status"]))
        return out

    def _apply(self, db: Any, task_id: str, rep: Report, now: float) -> Any:
        row = _get(db, task_id, self.LOCK_ROW)
        if (row["status"] not in ("leased", "processing") or row["lease_token"] is None
                or not secrets.compare_digest(row["lease_token"].encode(), rep.lease_token.encode())
                or row["worker_id"] != rep.worker_id or row["lease_deadline"] < now):
            raise _not_held(task_id, row["status"])
        if row["cancel_requested_at"] is not None:  # whatever the worker says, the task ends here
            self._end_cancelled(db, task_id, now, _worker_said(rep))
            raise _cancelled(task_id, rep.status)
        if rep.status == "processing":
            row = db.execute("UPDATE tasks SET status = 'processing', lease_deadline = ?, updated_at = ?,"
                             f" {self._webhook_started}, started_at = COALESCE(started_at, ?) WHERE id = ? RETURNING *",
                             (leases.deadline(now, self.lease_ttl_s), now, now, task_id)).fetchone()
        elif rep.status == "released":
            # Leased but never started (the worker is going down): back in the queue, and the
            # attempt does not count. The last error, if any, is kept.
            row = db.execute(f"UPDATE tasks SET status = 'queued', attempts = {self.GREATEST}(attempts - 1, 0),"
                             " lease_token = NULL, lease_deadline = NULL, updated_at = ? WHERE id = ? RETURNING *",
                             (now, task_id)).fetchone()
        elif rep.status == "succeeded":
            row = db.execute("UPDATE tasks SET status = 'succeeded', result = ?, error = NULL, lease_token = NULL,"
                             f" lease_deadline = NULL, updated_at = ?, finished_at = ?, {WEBHOOK_ENDED}"
                             " WHERE id = ? RETURNING *",
                             (rep.result.model_dump_json(), now, now, task_id)).fetchone()
        else:
            error = rep.error.model_copy(update={"worker_id": rep.worker_id})
            nxt = leases.after_failure(error.retryable, row["attempts"], row["max_attempts"])
            row = self._release(db, task_id, nxt, error, now)
        if row["status"] == "queued":
            self._notify(db, 1)
        return row

    # ------------------------------------------------------------ maintenance

    def sweep(self) -> int:
        """Requeues what expired leases and lost workers held, and prunes old registrations. The
        number of tasks requeued or failed; 0 when another process is sweeping."""
        now = self._clock()
        with self._tx() as db:
            if not self._maintenance_lock(db):
                return 0
            taken = self._expire(db, now)
            lost = self._lose_silent(db, now)
            taken += [t for worker in lost for t in worker.taken]
            db.execute(f"DELETE FROM workers WHERE status IN {CLOSED}"
                       " AND COALESCE(last_heartbeat, registered_at) < ?", (now - self.retention_s,))
            self._notify(db, len(taken))
        # Logged once committed: a sweep that rolled back took nothing back.
        _log_reclaimed(taken)
        for worker in lost:
            worker.log()
        return len(taken)

    # ------------------------------------------------------------ webhooks

    def claim_webhooks(self, limit: int, hold_s: float = 60.0) -> list[tuple[TaskView, float]]:
        """Tasks with a webhook event due, each held for `hold_s` (another process passes over it;
        if this one dies, it is due again after). Returns (task, claim mark) pairs."""
        now = self._clock()
        mark = now + hold_s
        with self._tx() as db:
            rows = db.execute(
                "UPDATE tasks SET webhook_due = ? WHERE id IN (SELECT id FROM tasks WHERE webhook_due IS NOT NULL"
                f" AND webhook_due <= ? ORDER BY webhook_due LIMIT ?{self.SKIP_LOCKED}) RETURNING *",
                (mark, now, limit)).fetchall()
        return [(self._view(r), mark) for r in rows]

    def webhook_attempted(self, task_id: str, attempt: WebhookAttempt, mark: float, next_due: float | None) -> None:
        """Records an attempt and when the next is due (None: delivered, or given up). An event that
        became due meanwhile (the task ended while its start was delivered) stays due."""
        with self._tx() as db:
            row = db.execute(f"SELECT webhook_attempts, webhook_due FROM tasks WHERE id = ?{self.LOCK_ROW}",
                             (task_id,)).fetchone()
            if row is None:  # removed by retention meanwhile
                return
            attempts = [*json.loads(row["webhook_attempts"]), attempt.model_dump()][-50:]
            due = next_due if row["webhook_due"] == mark else row["webhook_due"]
            db.execute("UPDATE tasks SET webhook_attempts = ?, webhook_due = ? WHERE id = ?",
                       (json.dumps(attempts), due, task_id))

    def purge(self, limit: int = 5000) -> list[str]:
        """Removes up to `limit` tasks whose retention has passed (`expires_at`); the result URIs they
        held, for the caller to remove where it was asked to."""
        with self._tx() as db:
            rows = db.execute(
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE finished_at < ? ORDER BY finished_at"
                " LIMIT ?) RETURNING result", (self._clock() - self.task_retention_s, limit)).fetchall()
        return [json.loads(r["result"])["uri"] for r in rows if r["result"]]

    def _expire(self, db: Any, now: float) -> list[Reclaimed]:
        """Tasks whose lease expired go back to the queue, or fail when out of attempts. A lease is
        held up to and including its deadline; strictly after it, it is gone."""
        rows = db.execute(f"SELECT {HELD_ROW} FROM tasks WHERE {HELD} AND lease_deadline < ?{self.LOCK_ROW}",
                          (now,)).fetchall()
        return [self._requeue_held(db, row, ErrorCode.LEASE_EXPIRED, f"worker {row['worker_id']} lost the lease", now)
                for row in rows]

    def _lose_silent(self, db: Any, now: float) -> list[Lost]:
        """Workers without a heartbeat for liveness_s are `lost`; what they held goes back now,
        well before the lease TTL. A lost worker that beats again is shown as it says it is. A
        drained one said goodbye: its silence is expected."""
        silent = db.execute(
            f"SELECT id, info, COALESCE(last_heartbeat, registered_at) AS seen FROM workers WHERE status NOT IN {CLOSED}"
            " AND COALESCE(last_heartbeat, registered_at) < ?", (now - self.liveness_s,)).fetchall()
        return [Lost(r["id"], json.loads(r["info"]).get("hostname", "?"), now - r["seen"],
                     self._retire(db, r["id"], "lost", ErrorCode.WORKER_LOST,
                                  f"worker {r['id']} sent no heartbeat for {self.liveness_s:g}s", now))
                for r in silent]

    def _replace(self, db: Any, node_id: str, new_id: str, now: float) -> list[Reclaimed]:
        old = [r["id"] for r in db.execute(
            "SELECT id FROM workers WHERE node_id = ? AND id != ? AND status != 'replaced'", (node_id, new_id))]
        return [taken for worker_id in old for taken in self._retire(
            db, worker_id, "replaced", ErrorCode.WORKER_RESTARTED,
            f"worker {worker_id} restarted (node {node_id} registered again as {new_id})", now)]

    def _retire(self, db: Any, worker_id: str, status: str, code: ErrorCode, why: str, now: float) -> list[Reclaimed]:
        """Marks a registration `replaced` or `lost` and requeues what it held."""
        db.execute("UPDATE workers SET status = ?, in_flight = '[]' WHERE id = ?", (status, worker_id))
        return self._take_back(db, worker_id, code, why, now)

    def _take_back(self, db: Any, worker_id: str, code: ErrorCode, why: str, now: float) -> list[Reclaimed]:
        rows = db.execute(f"SELECT {HELD_ROW} FROM tasks WHERE worker_id = ? AND {HELD}{self.LOCK_ROW}",
                          (worker_id,)).fetchall()
        return [self._requeue_held(db, row, code, why, now) for row in rows]

    def _requeue_held(self, db: Any, row: Any, code: ErrorCode, why: str, now: float) -> Reclaimed:
        """A held task whose worker is gone: queued again while attempts remain (the lost attempt
        counts, so a task that kills its workers does not loop forever), else failed with `code`."""
        taken = functools.partial(Reclaimed, row["id"], row["worker_id"], row["attempts"], row["max_attempts"], str(code))
        if row["cancel_requested_at"] is not None:  # a cancelled task never runs again
            self._end_cancelled(db, row["id"], now, f"{why} after the request")
            with self._reclaimed_lock:
                self.reclaimed[(str(code), "cancelled")] += 1
            return taken("cancelled")
        last = f"; last error: {json.loads(row['error'])['message']}" if row["error"] else ""
        error = ErrorEnvelope(code=code, retryable=True, worker_id=row["worker_id"],
                              message=f"{why} (attempt {row['attempts']} of {row['max_attempts']}){last}")
        nxt = leases.after_expiry(row["attempts"], row["max_attempts"])
        self._release(db, row["id"], nxt, error if nxt == "failed" else None, now)
        with self._reclaimed_lock:
            self.reclaimed[(str(code), nxt)] += 1
        return taken(nxt)

    @staticmethod
    def _release(db: Any, task_id: str, nxt: str, error: ErrorEnvelope | None, now: float) -> Any:
        # A requeued task keeps its last error for diagnosis; it is replaced by the next outcome.
        return db.execute(
            "UPDATE tasks SET status = ?, error = COALESCE(?, error), lease_token = NULL,"
            " lease_deadline = NULL, updated_at = ?, finished_at = ?,"
            " webhook_due = CASE WHEN webhook IS NOT NULL AND ? = 'failed' THEN 0 ELSE webhook_due END"
            " WHERE id = ? RETURNING *",
            (nxt, error.model_dump_json() if error else None, now, now if nxt == "failed" else None, nxt, task_id),
        ).fetchone()


def _get(db: Any, task_id: str, lock: str = "") -> Any:
    row = db.execute(f"SELECT * FROM tasks WHERE id = ?{lock}", (task_id,)).fetchone()
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row


def _alike(items: list[tuple[str, Report]]) -> bool:
    """Reports that one UPDATE can apply: all `processing` or all `succeeded`, each task once."""
    return (bool(items) and items[0][1].status in ("processing", "succeeded")
            and all(rep.status == items[0][1].status for _, rep in items)
            and len({task_id for task_id, _ in items}) == len(items))


def _cancel_error(why: str) -> str:
    return ErrorEnvelope(code=ErrorCode.CANCELLED, message=f"cancelled by a client ({why})",
                         retryable=False).model_dump_json()


def _worker_said(rep: Report) -> str:
    said = f": {rep.error.message}" if rep.error is not None else ""
    return f"the worker then reported {rep.status}{said}"


def _cancelled(task_id: str, status: str) -> Cancelled:
    return Cancelled(f"task {task_id} {CANCELLED_MARK}; its {status} report is refused")


def _not_held(task_id: str, status: str) -> Conflict:
    return Conflict(f"lease on task {task_id} is not held by this token (status {status})")


def _raised(out: TaskView | NotFound | Conflict) -> TaskView:
    if isinstance(out, Exception):
        raise out
    return out


def _require_worker(db: Any, worker_id: str) -> None:
    _check_registration(db.execute("SELECT status FROM workers WHERE id = ?", (worker_id,)).fetchall(), worker_id)


def _check_registration(rows: list, worker_id: str) -> None:
    """NotFound (the worker registers again) for an unknown worker, and for a drained one: it said it
    was leaving, so a lease or heartbeat on its registration is a bug or a reused id, never work."""
    if not rows:
        raise NotFound(f"no worker {worker_id}; register first")
    if rows[0]["status"] == "drained":
        raise NotFound(f"worker {worker_id} has drained and left; register again")


@functools.lru_cache(maxsize=64)
def _limits(text: str) -> WorkerLimits:
    """Parsed once per distinct JSON: every submission reads the fleet's limits."""
    return WorkerLimits.model_validate_json(text)


@dataclass(frozen=True)
class Reclaimed:
    """A held task taken back from its worker, logged once the transaction has committed."""

    task_id: str
    worker_id: str
    attempt: int
    max_attempts: int
    code: str  # why: lease_expired, worker_lost, worker_restarted, worker_drained
    outcome: str  # queued, failed (out of attempts), cancelled (a client asked)


@dataclass(frozen=True)
class Lost:
    """A worker the sweep marked `lost`, and what it held."""

    worker_id: str
    hostname: str
    silent_s: float
    taken: list[Reclaimed]

    def log(self) -> None:
        requeued = sum(t.outcome == "queued" for t in self.taken)
        log.warning("worker %s (%s) lost: no heartbeat for %.0fs; %d held task(s) requeued, %d failed for good",
                    self.worker_id, self.hostname, self.silent_s, requeued, len(self.taken) - requeued,
                    extra={"worker_id": self.worker_id, "status": "lost"})


_OUTCOME_WORDS = {"queued": "requeued", "failed": "failed for good", "cancelled": "ended cancelled"}


def _log_reclaimed(taken: list[Reclaimed]) -> None:
    for t in taken:
        log.warning("task %s %s: %s (worker %s, attempt %d of %d)", t.task_id, _OUTCOME_WORDS[t.outcome], t.code,
                    t.worker_id, t.attempt, t.max_attempts,
                    extra={"task_id": t.task_id, "worker_id": t.worker_id, "attempt": t.attempt, "error_code": t.code,
                           "status": t.outcome})
