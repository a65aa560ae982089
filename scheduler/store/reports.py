"""Reports and outcomes (base.Reports). A report changes its task only under the task's current,
unexpired lease (lifecycle.lease_held) and only if no client cancelled it: its outcome is one
conditional UPDATE, except a failure's, whose retry depends on the attempts left (a locked read,
then the UPDATE). A report that changed nothing is told apart afterwards by a read. A round's
`processing` or `succeeded` reports are one UPDATE per task, sent together (PostgreSQL: pipelined,
one round trip), and so are an exchange's, one statement per kind (a task's note with its result is
one UPDATE); other reports share one transaction, each applied on its own. SQLReports runs the
reports; ReportChanges holds what one report does to its task's row."""

from __future__ import annotations

import json
from typing import Any

from protocol import CANCELLED_MARK, FINAL_STATUSES, Report, TaskView
from scheduler import leases
from scheduler.store.base import Cancelled, Moved, Refused, Unknown
from scheduler.store.database import Database, task_row
from scheduler.store.lifecycle import HELD, WEBHOOK_ENDED, WEBHOOK_STARTED, end_cancelled, lease_held, release
from scheduler.store.plans import Plan, Read, Write, WriteEach, one

Reported = TaskView | Moved | Unknown | Refused


class SQLReports:
    def __init__(self, store: Database) -> None:
        self._store = store
        self._changes = ReportChanges(store)

    def report(self, task_id: str, rep: Report) -> TaskView:
        """Applies a worker's report if, and only if, it carries the task's current, unexpired lease."""
        return _raised(self.report_many([(task_id, rep)])[0])

    async def areport(self, task_id: str, rep: Report) -> TaskView:
        return _raised((await self.areport_many([(task_id, rep)]))[0])

    def report_many(self, items: list[tuple[str, Report]], views: bool = True) -> list[Reported]:
        """Several reports, each applied on its own and atomically: a refused one (Unknown, Refused,
        returned in its place) changes nothing and does not stop the others. An accepted one comes
        back as the task's view, or (not `views`) as what it moved the task to."""
        if _alike(items):
            return self._store._run(self._round(items, views))
        if not views and _moves_only(items):
            return self._store._run(self._mixed(items))
        return self._each(items, views)

    async def areport_many(self, items: list[tuple[str, Report]], views: bool = True) -> list[Reported]:
        if _alike(items):
            return await self._store._areports(self._round(items, views))
        if not views and _moves_only(items):
            return await self._store._areports(self._mixed(items))
        return await self._store.acall(self._each, items, views)

    def cancel(self, task_id: str) -> TaskView:
        now = self._store.clock()
        with self._store._tx() as db:
            row = task_row(db, task_id, self._store.LOCK_ROW)
            if row["status"] in FINAL_STATUSES:
                raise Refused(f"task {task_id} has already ended ({row['status']}); nothing to cancel")
            if row["status"] in HELD:  # its worker learns it; its next report or lease expiry ends it
                row = db.execute("UPDATE tasks SET cancel_requested_at = COALESCE(cancel_requested_at, ?),"
                                 " updated_at = ? WHERE id = ? RETURNING *", (now, now, task_id)).fetchone()
                self._store._cancel_marked(db, task_id)
            else:  # not leased: it ends now and is never leased
                row = one(db, end_cancelled(task_id, "while queued", now))
        return self._store.view(row)

    def _round(self, items: list[tuple[str, Report]], views: bool = True) -> Plan:
        """`processing` or `succeeded` reports of distinct tasks (a round's): their statements sent
        together; the refused ones told apart afterwards."""
        now = self._store.clock()
        moves = [self._changes.move(task_id, rep, now) for task_id, rep in items]
        changed = {r["id"]: r for r in (yield WriteEach(moves[0].sql, [m.args for m in moves]))}
        out: list[Reported] = []
        for task_id, rep in items:
            row = changed.get(task_id)
            if row is None:
                row = yield from self._changes.refused(task_id, rep, now)
            out.append(self._outcome(row, views))
        return out

    def _mixed(self, items: list[tuple[str, Report]]) -> Plan:
        """An exchange's reports (`_moves_only`): `processing` notes, `succeeded` results, and a
        task's note with its result, which is one UPDATE. One statement per kind, sent together
        where the backend can (the first group-committed on PostgreSQL); each refused one then
        applied or told apart on its own, as it would be alone. Outcomes without views."""
        now = self._store.clock()
        ends = _started_then_ended(items)
        paired = set(ends.values())
        kinds: dict[str, list[tuple[int, Write]]] = {}
        for k, (task_id, rep) in enumerate(items):
            if k in paired:
                continue
            move = (self._changes.started_succeeded(task_id, rep, items[ends[k]][1], now) if k in ends
                    else self._changes.move(task_id, rep, now))
            kinds.setdefault(move.sql, []).append((k, move))
        changed: dict[str, Any] = {}
        for moves in kinds.values():
            changed.update((r["id"], r) for r in (yield WriteEach(moves[0][1].sql, [m.args for _, m in moves])))
        out: list[Reported | None] = [None] * len(items)
        for k, (task_id, rep) in enumerate(items):
            if k in paired:
                continue
            row = changed.get(task_id)
            if k in ends:
                if row is not None:
                    out[k], out[ends[k]] = Moved(task_id, "processing"), self._outcome(row, False)
                    continue
                # Refused: each on its own, to be told apart as it would be alone.
                out[k] = self._outcome((yield from self._changes.one(task_id, rep, now)), False)
                out[ends[k]] = self._outcome((yield from self._changes.one(task_id, items[ends[k]][1], now)), False)
                continue
            out[k] = self._outcome(row if row is not None else (yield from self._changes.refused(task_id, rep, now)), False)
        return out

    def _each(self, items: list[tuple[str, Report]], views: bool = True) -> list[Reported]:
        now = self._store.clock()
        with self._store._tx() as db:
            done = [self._store._run_in(db, self._changes.one(task_id, rep, now)) for task_id, rep in items]
            self._store._notify(db, sum(not isinstance(d, Exception) and d["status"] == "queued" for d in done))
        return [self._outcome(d, views) for d in done]

    def _outcome(self, row: Any, views: bool) -> Reported:
        """A report's outcome from the row it left (or the error refusing it)."""
        if isinstance(row, Exception):
            return row
        return self._store.view(row) if views else Moved(row["id"], row["status"])

class ReportChanges:
    """What one report does to its task's row, as statements (plans): the UPDATE of each status,
    a failure's locked read first, and why a report that changed nothing was refused."""

    def __init__(self, store: Database) -> None:
        self._store = store
        self._started = WEBHOOK_STARTED.format(wants=store.WANTS_STARTED)

    def one(self, task_id: str, rep: Report, now: float) -> Plan:
        """One report, inside a transaction (`_run_in`: a failure's read keeps its row locked): the
        row it left, or the error refusing it."""
        rows = (yield from self.failed(task_id, rep, now)) if rep.status == "failed" else (
            yield self.move(task_id, rep, now))
        return rows[0] if rows else (yield from self.refused(task_id, rep, now))

    def move(self, task_id: str, rep: Report, now: float) -> Write:
        """A `processing`, `succeeded` or `released` report's outcome: one UPDATE."""
        fence, args = _fence(task_id, rep, now)
        if rep.status == "processing":
            # When the worker started it (its `at`, sent later in an exchange), within what can be true.
            started = now if rep.at is None else min(rep.at, now)
            return Write(f"UPDATE tasks SET status = 'processing', lease_deadline = ?, updated_at = ?, {self._started},"
                         f" started_at = COALESCE(started_at, {self._store.GREATEST}(created_at, ?)) WHERE {fence}"
                         " RETURNING *", (leases.deadline(now, self._store.lease_ttl_s), now, started, *args))
        if rep.status == "succeeded":
            return Write(f"UPDATE tasks SET {SUCCEEDED} WHERE {fence} RETURNING *",
                         (rep.result.model_dump_json(), now, now, *args))
        # Released: leased but never started (the worker is going down): back in the queue, and the
        # attempt does not count. The last error, if any, is kept.
        return Write(f"UPDATE tasks SET status = 'queued', attempts = {self._store.GREATEST}(attempts - 1, 0),"
                     f" lease_token = NULL, lease_deadline = NULL, updated_at = ? WHERE {fence} RETURNING *",
                     (now, *args))

    def started_succeeded(self, task_id: str, note: Report, final: Report, now: float) -> Write:
        """A `processing` note and the `succeeded` report after it, as one UPDATE."""
        fence, args = _fence(task_id, final, now)
        started = now if note.at is None else min(note.at, now)
        return Write(f"UPDATE tasks SET {SUCCEEDED}, started_at = COALESCE(started_at,"
                     f" {self._store.GREATEST}(created_at, ?)) WHERE {fence} RETURNING *",
                     (final.result.model_dump_json(), now, now, started, *args))

    def failed(self, task_id: str, rep: Report, now: float) -> Plan:
        """A failure: requeued only if the worker says a retry can help and attempts remain."""
        fence, args = _fence(task_id, rep, now)
        rows = yield Read(f"SELECT attempts, max_attempts FROM tasks WHERE {fence}{self._store.LOCK_ROW}", args)
        if not rows:
            return rows
        error = rep.error.model_copy(update={"worker_id": rep.worker_id})
        nxt = leases.after_failure(error.retryable, rows[0]["attempts"], rows[0]["max_attempts"])
        return (yield release(task_id, nxt, error, now))

    def refused(self, task_id: str, rep: Report, now: float) -> Plan:
        """Why a report changed nothing: no such task; a client cancelled it (then, whatever the
        worker says, the task ends here if the lease is still current); the same final report
        again (the task's row: answered as the first was); or the lease is not current."""
        found = yield Read("SELECT * FROM tasks WHERE id = ?", (task_id,))
        if not found:
            return Unknown(f"no task {task_id}")
        held = lease_held(rep.worker_id, now, rep.lease_token)
        if found[0]["cancel_requested_at"] is not None and (yield end_cancelled(task_id, _worker_said(rep), now, held)):
            return Cancelled(f"task {task_id} {CANCELLED_MARK}; its {rep.status} report is refused")
        if _replayed(found[0], rep):
            return found[0]
        return Refused(f"lease on task {task_id} is not held by this token (status {found[0]['status']})")


# A `succeeded` report's change; parameters: the result, then now twice. (The started webhook's
# mark is not needed beside it: the ended one is set whenever there is a webhook.)
SUCCEEDED = ("status = 'succeeded', result = ?, error = NULL, lease_token = NULL, lease_deadline = NULL,"
             f" updated_at = ?, finished_at = ?, {WEBHOOK_ENDED}")


def _moves_only(items: list[tuple[str, Report]]) -> bool:
    """Reports `_mixed` applies: `processing` and `succeeded` only, each task once, or its note then
    its result under the same lease."""
    if not all(rep.status in ("processing", "succeeded") for _, rep in items):
        return False
    ends = _started_then_ended(items)
    once = [task_id for k, (task_id, _) in enumerate(items) if k not in ends.values()]
    return len(set(once)) == len(once)


def _started_then_ended(items: list[tuple[str, Report]]) -> dict[int, int]:
    """Where a task's `processing` note is followed, next for that task, by its `succeeded` report
    under the same lease: the note's place -> the result's."""
    last: dict[str, int] = {}
    out = {}
    for k, (task_id, rep) in enumerate(items):
        i = last.get(task_id)
        if i is not None:
            before = items[i][1]
            if (before.status == "processing" and rep.status == "succeeded" and before.worker_id == rep.worker_id
                    and before.lease_token == rep.lease_token):
                out[i] = k
        last[task_id] = k
    return out


def _fence(task_id: str, rep: Report, now: float) -> tuple[str, tuple]:
    """The report's task, under the report's lease, not cancelled."""
    held, args = lease_held(rep.worker_id, now, rep.lease_token)
    return f"id = ? AND {held} AND cancel_requested_at IS NULL", (task_id, *args)


def _alike(items: list[tuple[str, Report]]) -> bool:
    """Reports that one statement can apply: all `processing` or all `succeeded`, each task once."""
    return (bool(items) and items[0][1].status in ("processing", "succeeded")
            and all(rep.status == items[0][1].status for _, rep in items)
            and len({task_id for task_id, _ in items}) == len(items))


def _replayed(row: Any, rep: Report) -> bool:
    """A final report the task already ended with, from the same worker: the same report again (a
    retry whose first answer did not arrive), answered as the first was, changing nothing."""
    if row["worker_id"] != rep.worker_id or row["status"] != rep.status:
        return False
    if rep.status == "succeeded":
        return row["result"] is not None and json.loads(row["result"]).get("uri") == rep.result.uri
    if rep.status == "failed":
        return row["error"] is not None and json.loads(row["error"]).get("code") == rep.error.code
    return False


def _worker_said(rep: Report) -> str:
    said = f": {rep.error.message}" if rep.error is not None else ""
    return f"the worker then reported {rep.status}{said}"


def _raised(out: Any) -> TaskView:
    if isinstance(out, Exception):
        raise out
    return out
