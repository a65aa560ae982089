"""Registrations and heartbeats (base.Workers). A heartbeat renews, in one UPDATE, the leases its
worker still holds; a node registering again, or a drain, gives back what the old registration held."""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from protocol import ErrorCode, Heartbeat, HeartbeatReply, RegisterWorker, RegistrationStatus, WorkerLimits, WorkerModels, WorkerView
from scheduler import leases
from scheduler.store.base import Unknown, worker_view
from scheduler.store.database import Database
from scheduler.store.lifecycle import REGISTERED, TAKING, lease_held, registration_sources, status_in
from scheduler.store.reclaim import Reclaimed, retire, settle, take_back

DRAINED, REPLACED = RegistrationStatus.DRAINED, RegistrationStatus.REPLACED



class SQLWorkers:
    def __init__(self, store: Database) -> None:
        self._store = store

    def register(self, req: RegisterWorker) -> tuple[str, int]:
        """(worker id, tasks requeued). A registration naming a node replaces that node's earlier
        registrations: their group restarted, so the tasks they held go back now, not at lease expiry."""
        worker_id = f"w-{uuid.uuid4().hex[:12]}"
        now = self._store.clock()
        with self._store._tx() as db:
            db.execute("INSERT INTO workers (id, info, status, registered_at, node_id, limits, max_adapters)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (worker_id, req.model_dump_json(exclude={"node_id", "limits", "models"}), REGISTERED.value,
                        now, req.node_id, req.limits.model_dump_json() if req.limits else None,
                        req.limits.max_adapters if req.limits else None))
            set_models(db, worker_id, req.models or held_alone(req.model), now)
            taken = self._replace(db, req.node_id, worker_id, now) if req.node_id else []
            self._store._notify(db, len(taken))
        settle(self._store, taken)
        return worker_id, len(taken)

    def _replace(self, db: Any, node_id: str, new_id: str, now: float) -> list[Reclaimed]:
        old = [r["id"] for r in db.execute(
            f"SELECT id FROM workers WHERE node_id = ? AND id != ? AND {status_in(registration_sources(REPLACED))}",
            (node_id, new_id))]
        return [taken for worker_id in old for taken in retire(
            self._store, db, worker_id, REPLACED, ErrorCode.WORKER_RESTARTED,
            f"worker {worker_id} restarted (node {node_id} registered again as {new_id})", now)]

    def heartbeat(self, worker_id: str, hb: Heartbeat) -> HeartbeatReply:
        """Records the worker's state and renews, in one UPDATE, the leases it still holds on its
        in-flight tasks; the others are `lost`."""
        now = self._store.clock()
        if hb.status == DRAINED:
            return self._drained(worker_id, hb, now)
        deadline = leases.deadline(now, self._store.lease_ttl_s)
        in_ids, ids = self._store._ids(hb.in_flight)
        held, held_args = lease_held(worker_id, now)
        with self._store._tx() as db:
            require_worker(db, worker_id)
            # The status it reports, where the lifecycle allows the move (a replaced registration
            # stays replaced: its group is gone or about to be).
            db.execute(f"UPDATE workers SET status = CASE WHEN {status_in(registration_sources(hb.status))}"
                       " THEN ? ELSE status END, in_flight = ?, last_heartbeat = ?, warnings = ?, counters = ?,"
                       " safety_policy = ? WHERE id = ?",
                       (hb.status, json.dumps(hb.in_flight), now, json.dumps(hb.warnings), json.dumps(hb.counters),
                        hb.safety_policy, worker_id))
            if hb.models is not None:
                set_models(db, worker_id, hb.models, now)
            rows = db.execute(f"UPDATE tasks SET lease_deadline = ?, updated_at = ? WHERE {held} AND {in_ids}"
                              " RETURNING id, cancel_requested_at", (deadline, now, *held_args, ids)).fetchall()
        renewed = {r["id"] for r in rows}
        return HeartbeatReply(renewed={t: deadline for t in hb.in_flight if t in renewed},
                              lost=[t for t in hb.in_flight if t not in renewed],
                              cancelled=sorted(r["id"] for r in rows if r["cancel_requested_at"] is not None))

    def known(self, worker_id: str) -> None:
        """Unknown unless `worker_id` is a registration that may still take work (not drained)."""
        require_worker(self._store._read(), worker_id)

    def _drained(self, worker_id: str, hb: Heartbeat, now: float) -> HeartbeatReply:
        """A drain's last heartbeat: the worker is leaving on purpose, so its registration ends
        `drained` (never `lost`; a replaced one stays replaced) and is refused for leases and
        heartbeats from now on. A clean drain holds nothing; whatever it still holds goes back now."""
        with self._store._tx() as db:
            require_worker(db, worker_id)
            db.execute(f"UPDATE workers SET status = CASE WHEN {status_in(registration_sources(DRAINED))}"
                       f" THEN '{DRAINED}' ELSE status END, in_flight = '[]', last_heartbeat = ?, warnings = ?, counters = ?, safety_policy = ? WHERE id = ?",
                       (now, json.dumps(hb.warnings), json.dumps(hb.counters), hb.safety_policy, worker_id))
            taken = take_back(self._store, db, worker_id, ErrorCode.WORKER_DRAINED,
                              f"worker {worker_id} drained while holding it", now)
            self._store._notify(db, len(taken))
        settle(self._store, taken)
        return HeartbeatReply(renewed={}, lost=list(hb.in_flight))

    def workers(self) -> list[WorkerView]:
        read = self._store._read()
        rows = read.execute("SELECT * FROM workers ORDER BY registered_at").fetchall()
        held: dict[str, WorkerModels] = {}
        for r in read.execute("SELECT worker_id, model, resident FROM worker_models ORDER BY model"):
            models = held.setdefault(r["worker_id"], WorkerModels())
            (models.resident if r["resident"] else models.loadable).append(r["model"])
        sets: dict[str, list[str]] = {}
        for r in read.execute("SELECT worker_id, adapters FROM worker_adapters ORDER BY since DESC, adapters"):
            sets.setdefault(r["worker_id"], []).append(r["adapters"])
        now = self._store.clock()
        return [worker_view(r, now, held.get(r["id"]), sets.get(r["id"], [])) for r in rows]

    def fleet_limits(self) -> list[WorkerLimits | None]:
        """The distinct limits of the workers that can take tasks (one row per kind of worker, however
        many there are); None for workers that advertised none."""
        rows = self._store._read().execute(
            f"SELECT DISTINCT limits FROM workers WHERE {status_in(TAKING)}").fetchall()
        return [_limits(r["limits"]) if r["limits"] else None for r in rows]


def held_alone(model: str) -> WorkerModels:
    """What a worker that names no models holds: the one it registered with (as it named it: an
    older worker's name need not be a model id, and matches none of the fleet's then)."""
    return WorkerModels.model_construct(resident=[model] if model else [], loadable=[])


def set_models(db: Any, worker_id: str, models: WorkerModels, now: float) -> None:
    """What a worker holds and can load, replacing what it said before; a model it still holds
    keeps the time it gained it (routing.py: one more worker per cold_wait_s)."""
    was = {r["model"]: r for r in db.execute(
        "SELECT model, resident, since FROM worker_models WHERE worker_id = ?", (worker_id,)).fetchall()}
    db.execute("DELETE FROM worker_models WHERE worker_id = ?", (worker_id,))
    resident = dict.fromkeys(models.resident)
    rows = [(m, 1, was[m]["since"] if m in was and was[m]["resident"] else now) for m in resident]
    rows += [(m, 0, now) for m in dict.fromkeys(models.loadable) if m not in resident]
    for model, flag, since in rows:
        db.execute("INSERT INTO worker_models (worker_id, model, resident, since) VALUES (?, ?, ?, ?)",
                   (worker_id, model, flag, since))


def require_worker(db: Any, worker_id: str) -> None:
    check_registration(db.execute("SELECT status FROM workers WHERE id = ?", (worker_id,)).fetchall(), worker_id)


def check_registration(rows: list, worker_id: str) -> None:
    """Unknown (the worker registers again) for an unknown worker, and for a drained one: it said it
    was leaving, so a lease or heartbeat on its registration is a bug or a reused id, never work."""
    if not rows:
        raise Unknown(f"no worker {worker_id}; register first")
    if rows[0]["status"] == DRAINED:
        raise Unknown(f"worker {worker_id} has drained and left; register again")


@functools.lru_cache(maxsize=64)
def _limits(text: str) -> WorkerLimits:
    """Parsed once per distinct JSON: every submission reads the fleet's limits."""
    return WorkerLimits.model_validate_json(text)
