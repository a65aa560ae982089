"""What a task's post stage ends with (a PostResult), and how every failure is written, for the
reporter and for all that fails a task: the admission, the serve loop, the post stage, the watchdog."""

from __future__ import annotations

from protocol import ErrorCode, ErrorEnvelope, TaskResult

# A stored, verified result; an error; or None when the result is dropped (the ledger says the lease
# is lost or a deadline passed; a newer attempt owns the task and reports it).
PostResult = TaskResult | ErrorEnvelope | None


def failure(code: ErrorCode, message: str, *, retryable: bool, details: dict | None = None) -> ErrorEnvelope:
    """The reporter logs it with the task id and adds the worker id when it reports."""
    return ErrorEnvelope(code=code, message=message[:4000], retryable=retryable, details=details)
