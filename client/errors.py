"""What can go wrong, one class per case, each message naming what to do."""

from __future__ import annotations

import httpx


class ClientError(Exception):
    """Base of every error the client raises."""


class AuthError(ClientError):
    """401/403: set the client token (DIT_TOKEN or --token)."""


class TaskNotFound(ClientError):
    """404: the id is wrong, or the task ended longer ago than the scheduler keeps tasks."""


class Conflict(ClientError):
    """409: the task has already ended (cancel), or an idempotency key was reused with another body."""


class InvalidRequest(ClientError):
    """413/422: the request itself is wrong; the message names the field."""


class RateLimited(ClientError):
    """429 after the retry deadline: the queue is full or this client is over its rate."""

    def __init__(self, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(ClientError):
    """5xx or no answer after the retry deadline: the scheduler is down or unreachable."""


class TaskFailed(ClientError):
    """The task ended `failed` or `cancelled` (raised by helpers that need a result)."""

    def __init__(self, task) -> None:
        err = task.error
        reason = f"{err.code}: {err.message}" if err else "no reason given"
        super().__init__(f"task {task.id} {task.status}: {reason}")
        self.task = task


class TaskNotEnded(ClientError):
    """The task is still queued or running: a wait ran out, or its result was asked for too early.
    Nothing is wrong with it; ask again later. `task` is the task as last seen."""

    def __init__(self, task, waited_s: float | None = None) -> None:
        after = f" after {waited_s:g}s" if waited_s is not None else ": it has no result yet"
        super().__init__(f"task {task.id} is still {task.status}{after}")
        self.task = task


class DownloadFailed(ClientError):
    """The task succeeded but its image could not be fetched here: a signed URL that expired, a
    file on another machine, storage that refused, or bytes that do not match the sha256."""


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        return resp.text[:500]
    if isinstance(detail, list):  # FastAPI's 422: one entry per field
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:])}: {e.get('msg', '')}" for e in detail)
    return str(detail)


class Retryable(Exception):
    """Internal: a 429 or 5xx answer, or no answer; retried until the deadline."""

    def __init__(self, message: str, retry_after_s: float | None = None, rate_limited: bool = False) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.rate_limited = rate_limited


def raise_for(resp: httpx.Response, url: str) -> None:
    """Maps every status the protocol uses to an error; returns for 2xx."""
    code = resp.status_code
    if code < 300:
        return
    detail = _detail(resp)
    if code in (401, 403):
        raise AuthError(f"{url} refused the token ({code}: {detail}); set DIT_TOKEN or pass --token")
    if code == 404:
        raise TaskNotFound(f"{detail}; check the id (ended tasks are removed after the scheduler's retention)")
    if code == 409:
        raise Conflict(detail)
    if code in (413, 422):
        raise InvalidRequest(f"the scheduler refused the request ({code}): {detail}")
    if code == 429:
        after = resp.headers.get("Retry-After")
        raise Retryable(f"429: {detail}", float(after) if after and after.isdigit() else None, rate_limited=True)
    if code >= 500:
        raise Retryable(f"{code}: {detail}")
    raise ClientError(f"unexpected answer {code} from {url}: {detail}")
