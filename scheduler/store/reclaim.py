"""Held tasks taken back from their workers (an expired lease; a lost, replaced or drained worker),
for the workers' and the maintenance roles: requeued while attempts remain, else failed, and ended
`cancelled` when a client asked. Counted (/metrics) and logged at WARNING once their transaction
has committed: one that rolled back took nothing back."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from protocol import ErrorCode, ErrorEnvelope, RegistrationStatus
from scheduler import leases
from scheduler.store.database import Database
from scheduler.store.lifecycle import HELD, end_cancelled, release, status_in
from scheduler.store.plans import one

log = logging.getLogger(__name__)

HELD_ROW = "id, attempts, max_attempts, error, worker_id, cancel_requested_at"


@dataclass(frozen=True)
class Reclaimed:
    """A held task taken back from its worker."""

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
                    extra={"worker_id": self.worker_id, "status": RegistrationStatus.LOST.value})


def retire(store: Database, db: Any, worker_id: str, status: RegistrationStatus, code: ErrorCode, why: str,
           now: float) -> list[Reclaimed]:
    """Marks a registration `replaced` or `lost` and takes back what it held."""
    db.execute("UPDATE workers SET status = ?, in_flight = '[]' WHERE id = ?", (status.value, worker_id))
    return take_back(store, db, worker_id, code, why, now)


def take_back(store: Database, db: Any, worker_id: str, code: ErrorCode, why: str, now: float) -> list[Reclaimed]:
    rows = db.execute(f"SELECT {HELD_ROW} FROM tasks WHERE worker_id = ? AND {status_in(HELD)}{store.LOCK_ROW}",
                      (worker_id,)).fetchall()
    return [requeue_held(db, row, code, why, now) for row in rows]


def requeue_held(db: Any, row: Any, code: ErrorCode, why: str, now: float) -> Reclaimed:
    """A held task whose worker is gone: queued again while attempts remain (the lost attempt
    counts, so a task that kills its workers does not loop forever), else failed with `code`."""
    taken = functools.partial(Reclaimed, row["id"], row["worker_id"], row["attempts"], row["max_attempts"], str(code))
    if row["cancel_requested_at"] is not None:  # a cancelled task never runs again
        one(db, end_cancelled(row["id"], f"{why} after the request", now))
        return taken("cancelled")
    last = f"; last error: {json.loads(row['error'])['message']}" if row["error"] else ""
    error = ErrorEnvelope(code=code, retryable=True, worker_id=row["worker_id"],
                          message=f"{why} (attempt {row['attempts']} of {row['max_attempts']}){last}")
    nxt = leases.after_expiry(row["attempts"], row["max_attempts"])
    one(db, release(row["id"], nxt, error if nxt == "failed" else None, now))
    return taken(nxt)


_OUTCOME_WORDS = {"queued": "requeued", "failed": "failed for good", "cancelled": "ended cancelled"}


def settle(store: Database, taken: list[Reclaimed]) -> None:
    """Counts and logs what a committed transaction took back."""
    for t in taken:
        store.reclaimed.add(t.code, t.outcome)
        log.warning("task %s %s: %s (worker %s, attempt %d of %d)", t.task_id, _OUTCOME_WORDS[t.outcome], t.code,
                    t.worker_id, t.attempt, t.max_attempts,
                    extra={"task_id": t.task_id, "worker_id": t.worker_id, "attempt": t.attempt, "error_code": t.code,
                           "status": t.outcome})
