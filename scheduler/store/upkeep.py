"""Maintenance (base.Upkeep), run periodically by the app, never inside a request: expired leases,
silent workers and old registrations (sweep), ended tasks past their retention (purge), webhook
events due. Meanwhile a lease past its deadline is already refused to its holder (the lease check)."""

from __future__ import annotations

import json
from typing import Any

from protocol import ErrorCode, RegistrationStatus, TaskView, WebhookAttempt
from scheduler.store.database import Database
from scheduler.store.lifecycle import CLOSED, HELD, registration_sources, status_in
from scheduler.store.reclaim import HELD_ROW, Lost, Reclaimed, requeue_held, retire, settle


class SQLUpkeep:
    def __init__(self, store: Database) -> None:
        self._store = store

    def sweep(self) -> int:
        """Requeues what expired leases and lost workers held, and prunes old registrations. The
        number of tasks requeued or failed; 0 when another process is sweeping."""
        now = self._store.clock()
        with self._store._tx() as db:
            if not self._store._maintenance_lock(db):
                return 0
            taken = self._expire(db, now)
            lost = self._lose_silent(db, now)
            taken += [t for worker in lost for t in worker.taken]
            db.execute(f"DELETE FROM workers WHERE {status_in(CLOSED)}"
                       " AND COALESCE(last_heartbeat, registered_at) < ?", (now - self._store.worker_retention_s,))
            db.execute("DELETE FROM worker_models WHERE NOT EXISTS"
                       " (SELECT 1 FROM workers WHERE workers.id = worker_models.worker_id)")
            db.execute("DELETE FROM worker_adapters WHERE NOT EXISTS"
                       " (SELECT 1 FROM workers WHERE workers.id = worker_adapters.worker_id)")
            self._store._notify(db, len(taken))
        settle(self._store, taken)
        for worker in lost:
            worker.log()
        return len(taken)

    def _expire(self, db: Any, now: float) -> list[Reclaimed]:
        """Tasks whose lease expired go back to the queue, or fail when out of attempts. A lease is
        held up to and including its deadline; strictly after it, it is gone."""
        rows = db.execute(f"SELECT {HELD_ROW} FROM tasks WHERE {status_in(HELD)} AND lease_deadline < ?"
                          f"{self._store.LOCK_ROW}", (now,)).fetchall()
        return [requeue_held(db, row, ErrorCode.LEASE_EXPIRED, f"worker {row['worker_id']} lost the lease", now)
                for row in rows]

    def _lose_silent(self, db: Any, now: float) -> list[Lost]:
        """Workers without a heartbeat for liveness_s are `lost`; what they held goes back now,
        well before the lease TTL. A lost worker that beats again is shown as it says it is. A
        drained one said goodbye: its silence is expected."""
        liveness_s = self._store.liveness_s
        silent = db.execute(
            f"SELECT id, info, COALESCE(last_heartbeat, registered_at) AS seen FROM workers"
            f" WHERE {status_in(registration_sources(RegistrationStatus.LOST))}"
            " AND COALESCE(last_heartbeat, registered_at) < ?", (now - liveness_s,)).fetchall()
        return [Lost(r["id"], json.loads(r["info"]).get("hostname", "?"), now - r["seen"],
                     retire(self._store, db, r["id"], RegistrationStatus.LOST, ErrorCode.WORKER_LOST,
                            f"worker {r['id']} sent no heartbeat for {liveness_s:g}s", now))
                for r in silent]

    def purge(self, limit: int = 5000) -> list[str]:
        """Removes up to `limit` tasks whose retention has passed (`expires_at`); the result URIs they
        held, for the caller to remove where it was asked to."""
        with self._store._tx() as db:
            rows = db.execute(
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE finished_at < ? ORDER BY finished_at"
                " LIMIT ?) RETURNING result", (self._store.clock() - self._store.task_retention_s, limit)).fetchall()
        return [json.loads(r["result"])["uri"] for r in rows if r["result"]]

    def claim_webhooks(self, limit: int, hold_s: float = 60.0) -> list[tuple[TaskView, float]]:
        """Tasks with a webhook event due, each held for `hold_s` (another process passes over it;
        if this one dies, it is due again after). Returns (task, claim mark) pairs."""
        now = self._store.clock()
        mark = now + hold_s
        with self._store._tx() as db:
            rows = db.execute(
                "UPDATE tasks SET webhook_due = ? WHERE id IN (SELECT id FROM tasks WHERE webhook_due IS NOT NULL"
                f" AND webhook_due <= ? ORDER BY webhook_due LIMIT ?{self._store.SKIP_LOCKED}) RETURNING *",
                (mark, now, limit)).fetchall()
        return [(self._store.view(r), mark) for r in rows]

    def webhook_attempted(self, task_id: str, attempt: WebhookAttempt, mark: float, next_due: float | None) -> None:
        """Records an attempt and when the next is due (None: delivered, or given up). An event that
        became due meanwhile (the task ended while its start was delivered) stays due."""
        with self._store._tx() as db:
            row = db.execute(f"SELECT webhook_attempts, webhook_due FROM tasks WHERE id = ?{self._store.LOCK_ROW}",
                             (task_id,)).fetchone()
            if row is None:  # removed by retention meanwhile
                return
            attempts = [*json.loads(row["webhook_attempts"]), attempt.model_dump()][-50:]
            due = next_due if row["webhook_due"] == mark else row["webhook_due"]
            db.execute("UPDATE tasks SET webhook_attempts = ?, webhook_due = ? WHERE id = ?",
                       (json.dumps(attempts), due, task_id))
