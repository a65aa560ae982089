"""Claims and leases (base.Claims). A claim is one UPDATE ... RETURNING over the queue's head
(PostgreSQL: FOR UPDATE SKIP LOCKED, so concurrent claims from several scheduler processes never wait
for, or take, each other's rows); written once as a plan, run blocking or on the event loop."""

from __future__ import annotations

import json

from protocol import Lease
from scheduler import leases
from scheduler.store.database import Database
from scheduler.store.lifecycle import sources, status_in
from scheduler.store.plans import Plan, Read, Write
from scheduler.store.workers import check_registration

CLAIMABLE = status_in(sources("leased"))  # the queue: the partial index's own condition


class SQLClaims:
    def __init__(self, store: Database) -> None:
        self._store = store

    def claim(self, worker_id: str, max_tasks: int) -> list[Lease]:
        return self._store._run(self._claim(worker_id, max_tasks))

    async def aclaim(self, worker_id: str, max_tasks: int) -> list[Lease]:
        return await self._store._arun(self._claim(worker_id, max_tasks))

    def _claim(self, worker_id: str, max_tasks: int) -> Plan:
        """Atomically lease up to `max_tasks` queued tasks, highest priority first, then FIFO: one
        UPDATE ... RETURNING, one round trip. Tokens are fresh random values made by the database
        (fencing tokens: a report also needs the worker's id and bearer token)."""
        store = self._store
        now = store.clock()
        deadline = leases.deadline(now, store.lease_ttl_s)
        rows = yield Write(
            f"UPDATE tasks SET status = 'leased', attempts = attempts + 1, worker_id = ?,"
            f" lease_token = {store.TOKEN_SQL}, lease_deadline = ?, updated_at = ?"
            f" WHERE id IN (SELECT id FROM tasks{store.QUEUE_INDEX} WHERE {CLAIMABLE} ORDER BY priority DESC, seq"
            f" LIMIT ?{store.SKIP_LOCKED}) AND EXISTS (SELECT 1 FROM workers WHERE id = ? AND status != 'drained')"
            f" RETURNING id, input, created_at, lease_token, attempts, priority, seq",
            (worker_id, deadline, now, max_tasks, worker_id))
        if not rows:
            check_registration((yield Read("SELECT status FROM workers WHERE id = ?", (worker_id,))), worker_id)
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        return [Lease(task_id=r["id"], input=json.loads(r["input"]), created_at=r["created_at"],
                      lease_token=r["lease_token"], lease_deadline=deadline, lease_ttl_s=store.lease_ttl_s,
                      attempt=r["attempts"]) for r in rows]
