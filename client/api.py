"""Client and AsyncClient: the queue protocol for applications, with the same methods sync and async.

Every call retries what a retry can fix (no answer, 5xx, 429 honouring Retry-After) until
`retry_deadline_s`, then raises Unavailable or RateLimited; the other statuses map to one error each
(client/errors.py). A submission carries an idempotency key (made here when the caller gives none),
so a retried POST never makes a second task. Waiting uses the scheduler's long poll
(`Prefer: wait=N`, `?wait_s=N`), not repeated polling.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx
from tenacity import AsyncRetrying, RetryError, Retrying, retry_if_exception_type, stop_after_delay
from tenacity.wait import wait_random_exponential

from client.errors import ClientError, RateLimited, Retryable, TaskFailed, Unavailable, raise_for
from protocol import FINAL_STATUSES, QueueFigures, TaskView, WorkerView

LONG_POLL_S = 60.0  # the most one wait call asks the scheduler for (it caps it too)
_backoff = wait_random_exponential(multiplier=0.5, max=10)


def scheduler_url(url: str) -> str:
    """The scheduler's base URL, checked before any call: an http(s) address with a host. A bare
    host:port gets http://, as curl does, rather than failing after a minute of retries."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"url {url!r}: not an http(s) address of the scheduler, e.g. http://127.0.0.1:8700")
    return text.rstrip("/")


def _wait(state) -> float:
    """Retry-After when the scheduler gave one, else exponential backoff with jitter."""
    exc = state.outcome.exception()
    if isinstance(exc, Retryable) and exc.retry_after_s is not None:
        return exc.retry_after_s
    return _backoff(state)


def submit_body(prompt: str, *, width: int | None = None, height: int | None = None, steps: int | None = None,
                seed: int | None = None, output_format: str | None = None, priority: int = 0,
                idempotency_key: str | None = None, **extra: Any) -> dict:
    given = {"width": width, "height": height, "steps": steps, "seed": seed, "output_format": output_format}
    task_input = {"prompt": prompt, **{k: v for k, v in given.items() if v is not None}, **extra}
    return {"input": task_input, "priority": priority, "idempotency_key": idempotency_key or uuid.uuid4().hex}


class _Common:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 retry_deadline_s: float = 60.0) -> None:
        self.url = scheduler_url(url)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout_s = timeout_s
        self._deadline_s = retry_deadline_s

    def _retry_args(self) -> dict:
        return {"retry": retry_if_exception_type(Retryable), "stop": stop_after_delay(self._deadline_s),
                "wait": _wait, "reraise": False}

    def _gave_up(self, e: RetryError) -> ClientError:
        last = e.last_attempt.exception()
        if isinstance(last, Retryable) and last.rate_limited:
            return RateLimited(f"{self.url}: {last} (still after {self._deadline_s:g}s of retries); "
                               "submit more slowly or try later", last.retry_after_s)
        return Unavailable(f"{self.url} did not answer usably for {self._deadline_s:g}s ({last}); is the "
                           "scheduler running and the URL right (DIT_URL, --url)?")

    def _request(self, method: str, path: str, json: Any = None, params: dict | None = None,
                 headers: dict | None = None, wait_s: float = 0.0) -> httpx.Request:
        return self._http.build_request(method, path, json=json, params=params, headers=headers,
                                        timeout=self._timeout_s + wait_s)


def _transport_error(e: httpx.TransportError) -> Retryable:
    return Retryable(f"{type(e).__name__}: {e}")


class Client(_Common):
    """Synchronous client; a context manager (closes its connections)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 retry_deadline_s: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(url, token, timeout_s, retry_deadline_s)
        self._http = httpx.Client(base_url=self.url, headers=self._headers, transport=transport)
        # Signed URLs: no token sent to storage, redirects followed.
        self._files = httpx.Client(timeout=timeout_s, follow_redirects=True, transport=transport)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        self._files.close()

    def _call(self, request: httpx.Request) -> Any:
        def once():
            try:
                resp = self._http.send(request)
            except httpx.TransportError as e:
                raise _transport_error(e) from e
            raise_for(resp, self.url)
            return resp.json()

        try:
            return Retrying(**self._retry_args())(once)
        except RetryError as e:
            raise self._gave_up(e) from None

    def submit(self, prompt: str, *, wait_s: float = 0.0, **options: Any) -> TaskView:
        """Queues a task; with `wait_s`, answers once it ends or after `wait_s` with it as it stands."""
        headers = {"Prefer": f"wait={wait_s:g}"} if wait_s > 0 else None
        return TaskView(**self._call(self._request("POST", "/v1/tasks", submit_body(prompt, **options),
                                                   headers=headers, wait_s=wait_s)))

    def get(self, task_id: str, wait_s: float = 0.0) -> TaskView:
        params = {"wait_s": wait_s} if wait_s > 0 else None
        return TaskView(**self._call(self._request("GET", f"/v1/tasks/{task_id}", params=params, wait_s=wait_s)))

    def wait(self, task_id: str, timeout_s: float | None = None,
             on_update: Callable[[TaskView], None] | None = None) -> TaskView:
        """The task once it has ended (long polls, one after another); ClientError after `timeout_s`."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = LONG_POLL_S if end is None else min(LONG_POLL_S, end - time.monotonic())
            task = self.get(task_id, wait_s=max(0.0, left))
            if on_update:
                on_update(task)
            if task.status in FINAL_STATUSES:
                return task
            if end is not None and time.monotonic() >= end:
                raise ClientError(f"task {task_id} is still {task.status} after {timeout_s:g}s; "
                                  f"`dit status {task_id}` shows it later, `dit cancel {task_id}` stops it")

    def cancel(self, task_id: str) -> TaskView:
        return TaskView(**self._call(self._request("POST", f"/v1/tasks/{task_id}/cancel")))

    def queue(self) -> QueueFigures:
        return QueueFigures(**self._call(self._request("GET", "/v1/queue")))

    def workers(self) -> list[WorkerView]:
        return [WorkerView(**w) for w in self._call(self._request("GET", "/v1/workers"))]

    def download(self, task: TaskView, path: str | Path) -> Path:
        """The task's image to `path`, from its signed URL, a local file or GCS; checked against its
        sha256. TaskFailed if the task did not succeed."""
        path, result = _target(task, path)
        if result.url and result.url.startswith("https://"):
            with self._files.stream("GET", result.url) as resp:
                _signed_url_ok(resp)
                with open(path, "wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
        else:
            _copy_stored(result.uri, path)
        return _verified(path, result)


class AsyncClient(_Common):
    """The same calls for asyncio; an async context manager."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 retry_deadline_s: float = 60.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(url, token, timeout_s, retry_deadline_s)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers, transport=transport)
        self._files = httpx.AsyncClient(timeout=timeout_s, follow_redirects=True, transport=transport)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._files.aclose()

    async def _call(self, request: httpx.Request) -> Any:
        async def once():
            try:
                resp = await self._http.send(request)
            except httpx.TransportError as e:
                raise _transport_error(e) from e
            raise_for(resp, self.url)
            return resp.json()

        try:
            return await AsyncRetrying(**self._retry_args())(once)
        except RetryError as e:
            raise self._gave_up(e) from None

    async def submit(self, prompt: str, *, wait_s: float = 0.0, **options: Any) -> TaskView:
        headers = {"Prefer": f"wait={wait_s:g}"} if wait_s > 0 else None
        return TaskView(**await self._call(self._request("POST", "/v1/tasks", submit_body(prompt, **options),
                                                         headers=headers, wait_s=wait_s)))

    async def get(self, task_id: str, wait_s: float = 0.0) -> TaskView:
        params = {"wait_s": wait_s} if wait_s > 0 else None
        return TaskView(**await self._call(self._request("GET", f"/v1/tasks/{task_id}", params=params,
                                                         wait_s=wait_s)))

    async def wait(self, task_id: str, timeout_s: float | None = None,
                   on_update: Callable[[TaskView], None] | None = None) -> TaskView:
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = LONG_POLL_S if end is None else min(LONG_POLL_S, end - time.monotonic())
            task = await self.get(task_id, wait_s=max(0.0, left))
            if on_update:
                on_update(task)
            if task.status in FINAL_STATUSES:
                return task
            if end is not None and time.monotonic() >= end:
                raise ClientError(f"task {task_id} is still {task.status} after {timeout_s:g}s")

    async def cancel(self, task_id: str) -> TaskView:
        return TaskView(**await self._call(self._request("POST", f"/v1/tasks/{task_id}/cancel")))

    async def queue(self) -> QueueFigures:
        return QueueFigures(**await self._call(self._request("GET", "/v1/queue")))

    async def workers(self) -> list[WorkerView]:
        return [WorkerView(**w) for w in await self._call(self._request("GET", "/v1/workers"))]

    async def download(self, task: TaskView, path: str | Path) -> Path:
        path, result = _target(task, path)
        if result.url and result.url.startswith("https://"):
            async with self._files.stream("GET", result.url) as resp:
                _signed_url_ok(resp)
                with open(path, "wb") as f:
                    async for chunk in resp.aiter_bytes():
                        f.write(chunk)
        else:
            await asyncio.to_thread(_copy_stored, result.uri, path)
        return _verified(path, result)


# ---------------------------------------------------------------- downloads, shared


def _target(task: TaskView, path: str | Path):
    if task.status != "succeeded" or task.result is None:
        raise TaskFailed(task)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, task.result


def _signed_url_ok(resp: httpx.Response) -> None:
    if resp.status_code >= 300:
        raise ClientError(f"the result's signed URL answered {resp.status_code}: it may have expired (it lasts "
                          "storage.gcs.signed_url_ttl_s from the upload); download the gs:// object with credentials")


def _copy_stored(uri: str, path: Path) -> None:
    """A result the client can reach directly: a local file (same host or a shared mount), or GCS
    (Application Default Credentials; STORAGE_EMULATOR_HOST is honoured)."""
    if uri.startswith("file://"):
        src = Path(unquote(urlparse(uri).path))
        if not src.exists():
            raise ClientError(f"{uri} is not on this machine; run the client where the results are, or configure "
                              "the worker to store in GCS with signed URLs (storage.gcs.signed_url_ttl_s)")
        shutil.copyfile(src, path)
    elif uri.startswith("gs://"):
        from google.cloud import storage  # only where GCS results are downloaded

        bucket, _, name = uri.removeprefix("gs://").partition("/")
        storage.Client().bucket(bucket).blob(name).download_to_filename(str(path))
    else:
        raise ClientError(f"cannot download {uri}: not file://, gs:// or a signed https URL")


def _verified(path: Path, result) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != result.sha256:
        path.unlink(missing_ok=True)
        raise ClientError(f"the downloaded bytes do not match the result's sha256 ({digest} != {result.sha256}); "
                          "try again")
    return path
