"""The error codes of the queue protocol (docs/protocol.md, "error").

A StrEnum, so each code is its own string on the wire: `ErrorCode.INVALID_REQUEST == "invalid_request"`.
Schedulers store codes as strings, so a newer worker may send a code an older scheduler does not list.
"""

from __future__ import annotations

from enum import StrEnum


# In the detail of a 409 refusing a report on a task a client cancelled: tells it from a lost lease.
CANCELLED_MARK = "was cancelled by a client"


def was_cancelled(detail: str | None) -> bool:
    return bool(detail) and CANCELLED_MARK in detail


class ErrorCode(StrEnum):
    # Final: a retry cannot fix these.
    INVALID_REQUEST = "invalid_request"
    UNSAFE_PROMPT = "unsafe_prompt"
    UNSAFE_IMAGE = "unsafe_image"
    STORAGE_CONFLICT = "storage_conflict"  # another object holds the task's name
    CANCELLED = "cancelled"  # the client cancelled it (POST /v1/tasks/{id}/cancel)
    # Retryable: another attempt, maybe on another worker, may succeed.
    GENERATION_FAILED = "generation_failed"
    CORRUPT_OUTPUT = "corrupt_output"
    SAFETY_CHECK_FAILED = "safety_check_failed"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    STORAGE_FAILED = "storage_failed"
    INTERNAL_ERROR = "internal_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"  # a stage ran past its deadline, or the serve loop stalled
    MODEL_UNAVAILABLE = "model_unavailable"  # its model failed to load on this worker, or is not one it serves
    ADAPTER_UNAVAILABLE = "adapter_unavailable"  # a LoRA adapter could not be fetched now (unreachable, timed out)
    # Set by the scheduler: a task's lease ran out, or the worker holding it restarted (its node
    # registered again); as the task's last error while it is retried, and final without attempts left.
    LEASE_EXPIRED = "lease_expired"
    WORKER_RESTARTED = "worker_restarted"
    WORKER_LOST = "worker_lost"  # no heartbeat for the scheduler's liveness time
    WORKER_DRAINED = "worker_drained"  # its last heartbeat said it drained, yet it still held the task
