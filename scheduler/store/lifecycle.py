"""The lifecycles as data: which status may follow which, for a task (TRANSITIONS) and for a worker
registration (REGISTRATION_TRANSITIONS). The SQL guards are built from them, so a statement can make
no move a table does not list; the property tests check every move they see against them, and
docs/architecture.md draws both. Here too the one lease check, and the statements that end a held
task."""

from __future__ import annotations

from collections.abc import Sequence

from protocol import ErrorCode, ErrorEnvelope, RegistrationStatus, TaskStatus
from scheduler.store.plans import Write

INITIAL: TaskStatus = "queued"  # a submitted task

# Every status change a task can make, and nothing else. Renewing a lease (a `processing` report on
# a processing task, a heartbeat) changes no status and is not listed. A status without a way out is
# final: the task never changes again, until retention removes it.
TRANSITIONS: dict[TaskStatus, tuple[TaskStatus, ...]] = {
    "queued": ("leased", "cancelled"),  # claimed; or cancelled before any worker took it
    # Held by a worker: started; back in the queue (released, a retryable failure, or its lease or
    # worker lost while attempts remain); ended by its report, out of attempts, or a client's cancel.
    "leased": ("processing", "queued", "succeeded", "failed", "cancelled"),
    "processing": ("queued", "succeeded", "failed", "cancelled"),
    "succeeded": (),
    "failed": (),
    "cancelled": (),
}


def sources(to: TaskStatus) -> tuple[TaskStatus, ...]:
    """The statuses a task may reach `to` from, in TRANSITIONS' order."""
    return tuple(status for status, nxt in TRANSITIONS.items() if to in nxt)


def status_in(statuses: Sequence[str], column: str = "status") -> str:
    """The condition `column` is one of `statuses`, written as the partial indexes name it."""
    if len(statuses) == 1:
        return f"{column} = '{statuses[0]}'"
    return "{} IN ({})".format(column, ", ".join(f"'{s}'" for s in statuses))


HELD = sources("succeeded")  # a worker holds the task: only its report ends it succeeded

R = RegistrationStatus
# Every status change a worker registration can make. A registration starts `initializing`; its
# heartbeats set the status the worker reports (initializing, ready, draining; drained as its last);
# the scheduler makes it `replaced` when the same node registers again (its group restarted) and
# `lost` when its heartbeats stop for the liveness time. A worker only goes forward: a ready one is
# never initializing again, and a drain is never undone (a heartbeat that says otherwise renews its
# leases and leaves the status as it was). A lost worker that beats again is shown as it says it
# is. A replaced registration stays replaced, whatever its old group still sends; a drained one is
# refused from then on, and is replaced if its node registers again.
REGISTRATION_TRANSITIONS: dict[RegistrationStatus, tuple[RegistrationStatus, ...]] = {
    R.INITIALIZING: (R.READY, R.DRAINING, R.DRAINED, R.REPLACED, R.LOST),
    R.READY: (R.DRAINING, R.DRAINED, R.REPLACED, R.LOST),
    R.DRAINING: (R.DRAINED, R.REPLACED, R.LOST),
    R.DRAINED: (R.REPLACED,),
    R.REPLACED: (),
    R.LOST: (R.INITIALIZING, R.READY, R.DRAINING, R.DRAINED, R.REPLACED),
}
REGISTERED = R.INITIALIZING  # a new registration


def registration_sources(to: RegistrationStatus) -> tuple[RegistrationStatus, ...]:
    """The statuses a registration may reach `to` from, in REGISTRATION_TRANSITIONS' order."""
    return tuple(status for status, nxt in REGISTRATION_TRANSITIONS.items() if to in nxt)


# Registrations that can take tasks: the fleet whose limits decide what a submission may ask for.
TAKING = (R.INITIALIZING, R.READY)
# Registrations that send no more heartbeats, the ones that cannot become lost: their silence is
# expected; they are pruned after the retention and left out of what is scraped.
CLOSED = tuple(status for status in REGISTRATION_TRANSITIONS if status not in registration_sources(R.LOST))


def lease_held(worker_id: str, now: float, token: str | None = None) -> tuple[str, tuple]:
    """The lease check, the one place it is written: the task is HELD by `worker_id`, its deadline
    not passed (a lease is held up to and including it) and, for a report, under `token`. The
    condition and its parameters. Tokens are compared in SQL, not in constant time: they are 122+
    random bits, and a report also needs the worker's bearer token."""
    held = f"worker_id = ? AND {status_in(HELD)} AND lease_deadline >= ?"
    if token is None:
        return held, (worker_id, now)
    return f"{held} AND lease_token = ?", (worker_id, now, token)


# Set in the same UPDATE as a final status (or the start), so a webhook event is never lost: due at
# once (0); the dispatcher (scheduler/webhooks.py) claims it, delivers, and records the attempt.
WEBHOOK_ENDED = "webhook_due = CASE WHEN webhook IS NULL THEN NULL ELSE 0 END"
# {wants}: the dialect's "the webhook asks for the started event" (no %: psycopg reads it as a placeholder).
WEBHOOK_STARTED = "webhook_due = CASE WHEN {wants} AND started_at IS NULL THEN 0 ELSE webhook_due END"
# A task ending `cancelled`; parameters: the error, then now three times.
CANCEL_SET = ("status = 'cancelled', error = ?, lease_token = NULL, lease_deadline = NULL,"
              " cancel_requested_at = COALESCE(cancel_requested_at, ?), updated_at = ?, finished_at = ?,"
              f" {WEBHOOK_ENDED}")


def end_cancelled(task_id: str, why: str, now: float, held: tuple[str, tuple] | None = None) -> Write:
    """Ends the task `cancelled`; with `held` (a lease check), only if the lease is still current."""
    where, args = held or (status_in(sources("cancelled")), ())
    return Write(f"UPDATE tasks SET {CANCEL_SET} WHERE id = ? AND {where} RETURNING *",
                 (cancel_error(why), now, now, now, task_id, *args))


def release(task_id: str, nxt: TaskStatus, error: ErrorEnvelope | None, now: float) -> Write:
    """A held task back in the queue or failed (`nxt`), its lease gone. A requeued task keeps its
    last error for diagnosis; it is replaced by the next outcome."""
    return Write(
        "UPDATE tasks SET status = ?, error = COALESCE(?, error), lease_token = NULL,"
        " lease_deadline = NULL, updated_at = ?, finished_at = ?,"
        " webhook_due = CASE WHEN webhook IS NOT NULL AND ? = 'failed' THEN 0 ELSE webhook_due END"
        f" WHERE id = ? AND {status_in(sources(nxt))} RETURNING *",
        (nxt, error.model_dump_json() if error else None, now, now if nxt == "failed" else None, nxt, task_id))


def cancel_error(why: str) -> str:
    return ErrorEnvelope(code=ErrorCode.CANCELLED, message=f"cancelled by a client ({why})",
                         retryable=False).model_dump_json()
