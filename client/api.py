"""Client and AsyncClient: the queue protocol for applications, with the same methods sync and async.

Every call retries what a retry can fix (no answer, 5xx, 429 honouring Retry-After) until
`retry_deadline_s`, then raises Unavailable or RateLimited; the other statuses map to one error each
(client/errors.py). A submission carries an idempotency key (made here when the caller gives none),
so a retried POST never makes a second task. Waiting uses the scheduler's long poll
(`Prefer: wait=N`, `?wait_s=N`), not repeated polling; a wait that runs out raises TaskNotEnded,
a task that failed or was cancelled TaskFailed, an image that cannot be fetched DownloadFailed.
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

from client.errors import (ClientError, DownloadFailed, RateLimited, Retryable, TaskFailed, TaskNotEnded, Unavailable,
                           raise_for)
from protocol import FINAL_STATUSES, ModelsView, QueueFigures, TaskList, TaskView, WorkerView

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
                seed: int | None = None, output_format: str | None = None, num_images: int | None = None,
                priority: int = 0, idempotency_key: str | None = None, model: str | None = None, **extra: Any) -> dict:
    given = {"width": width, "height": height, "steps": steps, "seed": seed, "output_format": output_format,
             "num_images": num_images}
    task_input = {"prompt": prompt, **{k: v for k, v in given.items() if v is not None}, **extra}
    body = {"input": task_input, "priority": priority, "idempotency_key": idempotency_key or uuid.uuid4().hex}
    return {**body, "model": model} if model else body  # none: the fleet's default


class _Common:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 retry_deadline_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = scheduler_url(url)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout_s = timeout_s
        self._deadline_s = retry_deadline_s
        self._clock = clock  # what `wait` measures its timeout with (tests move it by hand)

    def _wait_end(self, timeout_s: float | None) -> float | None:
        return None if timeout_s is None else self._clock() + timeout_s

    def _next_poll_s(self, end: float | None, poll_s: float) -> float:
        """The next long poll's wait: `poll_s`, or what is left of the whole wait when that is less."""
        return poll_s if end is None else max(0.0, min(poll_s, end - self._clock()))

    def _ran_out(self, end: float | None) -> bool:
        return end is not None and self._clock() >= end

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


def _list_params(status: str | None, limit: int, offset: int) -> dict:
    return {"limit": limit, "offset": offset, **({"status": status} if status else {})}


class Client(_Common):
    """Synchronous client; a context manager (closes its connections)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 retry_deadline_s: float = 60.0, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(url, token, timeout_s, retry_deadline_s, clock)
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
             on_update: Callable[[TaskView], None] | None = None, poll_s: float = LONG_POLL_S) -> TaskView:
        """The task once it has ended (long polls, one after another); TaskNotEnded after `timeout_s`.
        A long poll answers at once when the task ends; a shorter `poll_s` only calls `on_update`
        more often (a progress display that shows the task's state as it changes)."""
        end = self._wait_end(timeout_s)
        while True:
            task = self.get(task_id, wait_s=self._next_poll_s(end, poll_s))
            if on_update:
                on_update(task)
            if task.status in FINAL_STATUSES:
                return task
            if self._ran_out(end):
                raise TaskNotEnded(task, timeout_s)

    def list_tasks(self, status: str | None = None, limit: int = 100, offset: int = 0) -> list[TaskView]:
        """Tasks in submission order, oldest first (the scheduler's order), `limit` from `offset`."""
        params = _list_params(status, limit, offset)
        return TaskList(**self._call(self._request("GET", "/v1/tasks", params=params))).tasks

    def cancel(self, task_id: str) -> TaskView:
        return TaskView(**self._call(self._request("POST", f"/v1/tasks/{task_id}/cancel")))

    def queue(self) -> QueueFigures:
        return QueueFigures(**self._call(self._request("GET", "/v1/queue")))

    def models(self) -> ModelsView:
        """The fleet's models, each with its queue and workers."""
        return ModelsView(**self._call(self._request("GET", "/v1/models")))

    def workers(self) -> list[WorkerView]:
        return [WorkerView(**w) for w in self._call(self._request("GET", "/v1/workers"))]

    def download(self, task: str | TaskView, path: str | Path, index: int | None = None) -> Path:
        """The task's image to `path`, from its signed URL, a local file or GCS; checked against its
        sha256. `task` is a TaskView or an id (then fetched first, without waiting); `index`, one of
        its images (input.num_images), or the first stored. TaskFailed if it failed or was
        cancelled, TaskNotEnded if it has not ended, DownloadFailed if the image cannot be fetched
        from here or was withheld."""
        if isinstance(task, str):
            task = self.get(task)
        path, result = _target(task, path, index)
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
                 retry_deadline_s: float = 60.0, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(url, token, timeout_s, retry_deadline_s, clock)
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
                   on_update: Callable[[TaskView], None] | None = None, poll_s: float = LONG_POLL_S) -> TaskView:
        end = self._wait_end(timeout_s)
        while True:
            task = await self.get(task_id, wait_s=self._next_poll_s(end, poll_s))
            if on_update:
                on_update(task)
            if task.status in FINAL_STATUSES:
                return task
            if self._ran_out(end):
                raise TaskNotEnded(task, timeout_s)

    async def list_tasks(self, status: str | None = None, limit: int = 100, offset: int = 0) -> list[TaskView]:
        params = _list_params(status, limit, offset)
        return TaskList(**await self._call(self._request("GET", "/v1/tasks", params=params))).tasks

    async def cancel(self, task_id: str) -> TaskView:
        return TaskView(**await self._call(self._request("POST", f"/v1/tasks/{task_id}/cancel")))

    async def queue(self) -> QueueFigures:
        return QueueFigures(**await self._call(self._request("GET", "/v1/queue")))

    async def models(self) -> ModelsView:
        return ModelsView(**await self._call(self._request("GET", "/v1/models")))

    async def workers(self) -> list[WorkerView]:
        return [WorkerView(**w) for w in await self._call(self._request("GET", "/v1/workers"))]

    async def download(self, task: str | TaskView, path: str | Path, index: int | None = None) -> Path:
        if isinstance(task, str):
            task = await self.get(task)
        path, result = _target(task, path, index)
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


def _target(task: TaskView, path: str | Path, index: int | None = None):
    if task.status not in FINAL_STATUSES:
        raise TaskNotEnded(task)
    if task.status != "succeeded" or task.result is None:
        raise TaskFailed(task)
    result = task.result
    if index is not None and (index or result.images):
        image = next((i for i in result.images if i.index == index), None)
        if image is None:
            raise DownloadFailed(f"task {task.id} has no image {index} (it made {len(result.images) or 1})")
        if image.withheld is not None:
            raise DownloadFailed(f"image {index} of task {task.id} was withheld: {image.withheld.message}")
        result = image
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, result


def image_path(path: str | Path, index: int) -> Path:
    """Where image `index` of a task downloaded to `path` goes: `path` itself for the first,
    `<stem>~<index><suffix>` beside it for the others (as the worker names its objects)."""
    path = Path(path)
    return path if index == 0 else path.with_name(f"{path.stem}~{index}{path.suffix}")


def _signed_url_ok(resp: httpx.Response) -> None:
    if resp.status_code >= 300:
        raise DownloadFailed(f"the result's signed URL answered {resp.status_code}: it may have expired (it "
                             "lasts storage.gcs.signed_url_ttl_s from the upload); download the gs:// object with "
                             "credentials")


def _copy_stored(uri: str, path: Path) -> None:
    """A result the client can reach directly: a local file (same host or a shared mount), or GCS
    (Application Default Credentials; STORAGE_EMULATOR_HOST is honoured)."""
    if uri.startswith("file://"):
        src = Path(unquote(urlparse(uri).path))
        if not src.exists():
            raise DownloadFailed(f"{uri} is not on this machine; run the client where the results are, or "
                                 "configure the worker to store in GCS with signed URLs (storage.gcs.signed_url_ttl_s)")
        shutil.copyfile(src, path)
    elif uri.startswith("gs://"):
        _copy_from_gcs(uri, path)
    else:
        raise DownloadFailed(f"cannot download {uri}: not file://, gs:// or a signed https URL")


def _copy_from_gcs(uri: str, path: Path) -> None:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    try:
        from google.cloud import storage  # only where GCS results are downloaded

        storage.Client().bucket(bucket).blob(name).download_to_filename(str(path))
    except Exception as e:  # no credentials, no access, no object: all mean "not from here, not now"
        raise DownloadFailed(f"{uri}: {type(e).__name__}: {e}; check the Application Default Credentials "
                             "(gcloud auth application-default login) and their access to the bucket") from e


def _verified(path: Path, result) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != result.sha256:
        path.unlink(missing_ok=True)
        raise DownloadFailed(f"the downloaded bytes do not match the result's sha256 ({digest} != "
                             f"{result.sha256}); try again")
    return path
