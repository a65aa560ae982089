"""Claims and leases (base.Claims). A claim is one UPDATE ... RETURNING over the queue's head
(PostgreSQL: FOR UPDATE SKIP LOCKED, so concurrent claims from several scheduler processes never wait
for, or take, each other's rows); written once as a plan, run blocking or on the event loop.

On a fleet of several models (the store's `models`), a claim first reads the head of each model's
queue that the worker serves and picks one model (routing.pick); the UPDATE then takes that model's
tasks only: a lease's tasks share one model, so a worker swaps at most once per lease.

Adapters (a task's input.loras, by protocol.adapter_set_key): a worker that says which sets it holds
loaded gets their tasks first; otherwise a task whose set another live worker holds is left to it
for `adapter_wait_s` after its submission, then anyone takes it; a set nobody holds goes to the first
worker that asks, which is then taken to hold it (no herd of loads within the wait)."""

from __future__ import annotations

import json

from protocol import Lease, RegistrationStatus
from scheduler import leases
from scheduler.store import routing
from scheduler.store.database import Database
from scheduler.store.lifecycle import TAKING, lease_held, sources, status_in
from scheduler.store.plans import Plan, Read, Write, WriteEach
from scheduler.store.workers import check_registration

CLAIMABLE = status_in(sources("leased"))  # the queue: the partial index's own condition
UPSERT_MODEL = ("INSERT INTO worker_models (worker_id, model, resident, since) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (worker_id, model) DO UPDATE SET resident = excluded.resident, since = excluded.since"
                " RETURNING worker_id")  # a step returns rows
UPSERT_ADAPTERS = ("INSERT INTO worker_adapters (worker_id, adapters, since) VALUES (?, ?, ?)"
                   " ON CONFLICT (worker_id, adapters) DO NOTHING RETURNING worker_id")


class SQLClaims:
    def __init__(self, store: Database) -> None:
        self._store = store

    def claim(self, worker_id: str, max_tasks: int, resident: list[str] | None = None,
              claim_id: str | None = None, adapters: list[str] | None = None) -> list[Lease]:
        return self._store._run(self._plan(worker_id, max_tasks, resident, claim_id, adapters))

    async def aclaim(self, worker_id: str, max_tasks: int, resident: list[str] | None = None,
                     claim_id: str | None = None, adapters: list[str] | None = None) -> list[Lease]:
        return await self._store._aclaims(self._plan(worker_id, max_tasks, resident, claim_id, adapters))

    def claimed(self, worker_id: str, claim_id: str) -> list[Lease]:
        """The leases an exchange named `claim_id` claimed that its worker still holds unstarted:
        what a retry of that exchange is answered (its first answer may never have arrived)."""
        held, args = lease_held(worker_id, self._store.clock())
        rows = self._store._read().execute(
            f"SELECT id, input, created_at, lease_token, lease_deadline, attempts, priority, seq, model FROM tasks"
            f" WHERE {held} AND status = 'leased' AND claim_id = ? ORDER BY priority DESC, seq",
            (*args, claim_id)).fetchall()
        return [_lease(r, r["lease_deadline"], self._store.lease_ttl_s) for r in rows]

    def cancelled_among(self, worker_id: str, task_ids: list[str]) -> list[str]:
        """Which of the tasks `worker_id` holds a client cancelled."""
        return self._store._run(self._cancelled_among(worker_id, task_ids))

    async def acancelled_among(self, worker_id: str, task_ids: list[str]) -> list[str]:
        """cancelled_among from the event loop (PostgreSQL: on it, not on a thread); nothing read
        where the store knows none of them can be marked (SQLite: its one process marks them all)."""
        if not self._store._may_be_cancelled(task_ids):
            return []
        return await self._store._aread(self._cancelled_among(worker_id, task_ids))

    def _cancelled_among(self, worker_id: str, task_ids: list[str]) -> Plan:
        in_ids, ids = self._store._ids(task_ids)
        rows = yield Read(f"SELECT id FROM tasks WHERE {in_ids} AND worker_id = ? AND cancel_requested_at IS NOT NULL",
                          (ids, worker_id))
        return sorted(r["id"] for r in rows)

    def _plan(self, worker_id: str, max_tasks: int, resident: list[str] | None, claim_id: str | None,
              adapters: list[str] | None = None) -> Plan:
        held = (yield from self._holds(worker_id, adapters)) if adapters is not None else ()
        if self._store.models:
            return (yield from self._routed(worker_id, max_tasks, resident, claim_id, held))
        return (yield from self._claim(worker_id, max_tasks, claim_id=claim_id, held=held))

    def _holds(self, worker_id: str, adapters: list[str]) -> Plan:
        """The sets of adapters the worker says it holds now, replacing what the store has."""
        had = {r["adapters"] for r in (yield Read("SELECT adapters FROM worker_adapters WHERE worker_id = ?",
                                                  (worker_id,)))}
        said = set(adapters)
        if gone := sorted(had - said):
            yield Write(f"DELETE FROM worker_adapters WHERE worker_id = ? AND adapters IN ({_marks(gone)})"
                        " RETURNING worker_id", (worker_id, *gone))
        if new := sorted(said - had):
            yield WriteEach(UPSERT_ADAPTERS, [(worker_id, key, self._store.clock()) for key in new])
        return sorted(said)

    def _claim(self, worker_id: str, max_tasks: int, model: str | None = None, claim_id: str | None = None,
               held: tuple[str, ...] | list[str] = ()) -> Plan:
        """Atomically lease up to `max_tasks` queued tasks (of `model` alone, when given), highest
        priority first, then FIFO: one UPDATE ... RETURNING, one round trip (two for a worker that
        holds adapters and finds none of their tasks). Tokens are fresh random values made by the
        database (fencing tokens: a report also needs the worker's id and bearer token)."""
        store = self._store
        now = store.clock()
        deadline = leases.deadline(now, store.lease_ttl_s)
        of_model, args = ("", ()) if model is None else (" AND model = ?", (model,))
        rows = []
        if held:  # the tasks of the sets of adapters it holds loaded, first
            rows = yield Write(_update(store, store.ADAPTER_QUEUE_INDEX,
                                       f" AND adapters <> '' AND adapters IN ({_marks(held)}){of_model}"),
                               (worker_id, deadline, now, claim_id, *held, *args, max_tasks, worker_id))
        if not rows:
            rows = yield Write(_update(store, store.QUEUE_INDEX if model is None else store.MODEL_QUEUE_INDEX,
                                       of_model + HELD_ELSEWHERE),
                               (worker_id, deadline, now, claim_id, *args, worker_id, now - store.adapter_wait_s,
                                worker_id, max_tasks, worker_id))
        if not rows:
            check_registration((yield Read("SELECT status FROM workers WHERE id = ?", (worker_id,))), worker_id)
        if taken := sorted({r["adapters"] for r in rows} - {""} - set(held)):
            yield WriteEach(UPSERT_ADAPTERS, [(worker_id, key, now) for key in taken])  # it will hold them
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        return [_lease(r, deadline, store.lease_ttl_s) for r in rows]

    def _routed(self, worker_id: str, max_tasks: int, resident: list[str] | None, claim_id: str | None,
                held: list[str] | tuple[str, ...] = ()) -> Plan:
        """What the worker serves (updated first when its lease says what it holds now), the head
        of each of those models' queues, and who holds them: then the claim of the model picked,
        and that model marked resident on the worker when it will have to load it."""
        store = self._store
        now = store.clock()
        mine = {r["model"]: bool(r["resident"]) for r in (yield Read(
            "SELECT model, resident FROM worker_models WHERE worker_id = ?", (worker_id,)))}
        if resident is not None and (changed := routing.changes(mine, resident)):
            yield WriteEach(UPSERT_MODEL, [(worker_id, m, int(r), now) for m, r in changed.items()])
            mine.update(changed)
        served = sorted(m for m in mine if m in store.models)
        heads = (yield Read(*_heads(store.MODEL_QUEUE_INDEX, served))) if served else []
        holders = {}
        if any(not mine[h["model"]] for h in heads):  # a model it would load: who holds it, since when
            holders = {r["model"]: (r["warm"], r["gained"]) for r in (yield Read(
                "SELECT wm.model, COUNT(*) AS warm, MAX(wm.since) AS gained FROM worker_models wm"
                f" JOIN workers w ON w.id = wm.worker_id WHERE wm.resident = 1 AND {status_in(TAKING, 'w.status')}"
                " GROUP BY wm.model",
                ()))}
        model = routing.pick(heads, mine, holders, now, store.cold_wait_s, store.route)
        if model is None:
            if not mine:
                check_registration((yield Read("SELECT status FROM workers WHERE id = ?", (worker_id,))), worker_id)
            return []
        got = yield from self._claim(worker_id, max_tasks, model, claim_id, held)
        if got and not mine[model]:
            yield Write(UPSERT_MODEL, (worker_id, model, 1, now))
        return got


# A task with adapters goes to no worker that takes none (it would fail it), and one whose adapters
# another live worker holds is left to that worker for adapter_wait_s after its submission (args: the
# claiming worker, that time's start, the claiming worker). The subqueries do not depend on the row:
# one read each per claim; a task without adapters stops at the first term.
HELD_ELSEWHERE = (" AND (adapters = '' OR (NOT EXISTS (SELECT 1 FROM workers WHERE id = ? AND max_adapters = 0)"
                  " AND (created_at <= ? OR adapters NOT IN (SELECT wa.adapters FROM worker_adapters wa"
                  f" JOIN workers w ON w.id = wa.worker_id WHERE wa.worker_id != ? AND {status_in(TAKING, 'w.status')}))))")


def _update(store: Database, queue: str, where: str) -> str:
    """The claim: the first queued tasks of `queue` that `where` allows, leased to the worker."""
    return (f"UPDATE tasks SET status = 'leased', attempts = attempts + 1, worker_id = ?,"
            f" lease_token = {store.TOKEN_SQL}, lease_deadline = ?, updated_at = ?, claim_id = ?"
            f" WHERE id IN (SELECT id FROM tasks{queue} WHERE {CLAIMABLE}{where} ORDER BY priority DESC, seq"
            f" LIMIT ?{store.SKIP_LOCKED}) AND EXISTS"
            f" (SELECT 1 FROM workers WHERE id = ? AND status != '{RegistrationStatus.DRAINED}')"
            f" RETURNING id, input, created_at, lease_token, attempts, priority, seq, model, adapters")


def _marks(values) -> str:
    return ", ".join("?" * len(values))


def _lease(row, deadline: float, ttl_s: float) -> Lease:
    return Lease(task_id=row["id"], input=json.loads(row["input"]), created_at=row["created_at"],
                 lease_token=row["lease_token"], lease_deadline=deadline, lease_ttl_s=ttl_s,
                 attempt=row["attempts"], model=row["model"])


def _heads(index: str, models: list[str]) -> tuple[str, tuple]:
    """One read: the first task in lease order of each model's queue."""
    one = (f"SELECT * FROM (SELECT model, priority, seq, created_at FROM tasks{index} WHERE {CLAIMABLE}"
           " AND model = ? ORDER BY priority DESC, seq LIMIT 1) AS h{i}")
    return " UNION ALL ".join(one.format(i=i) for i in range(len(models))), tuple(models)
