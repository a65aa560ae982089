"""Rank 0's downloads of the adapters tasks bring (input.loras), beside admission: a task whose
files are all in the node's cache has them at once; one that needs a download is fetched on a pool
of `lora.fetches` threads, in the `fetch` stage under its own deadline, and handed on when its files
are there. A download that takes a minute holds its own task alone, never the others of its lease
or the next leases."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from protocol import ErrorCode
from worker.adapters import AdapterCache, AdapterRefused, AdapterUnavailable, Source
from worker.serving.ledger import Ledger, Stage
from worker.serving.reporter import Reporter
from worker.serving.task import Task

log = logging.getLogger(__name__)


class Fetches:
    def __init__(self, cache: AdapterCache, threads: int, reporter: Reporter, ledger: Ledger) -> None:
        self.cache = cache
        self.reporter = reporter
        self.ledger = ledger
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="adapter-fetch")
        self._lock = threading.Lock()
        self._fetching = 0  # tasks whose adapters are being fetched

    def cached(self, task: Task) -> bool:
        """Whether every adapter of the task is in the node's cache now (no download to wait for)."""
        return all(self.cache.has(Source(ref.source, ref.field), ref.sha256) for ref in task.job.loras)

    def pending(self) -> int:
        with self._lock:
            return self._fetching

    def fetch(self, task: Task, then: Callable[[list[Task]], list[Task]],
              ready: Callable[[list[Task]], None] | None) -> None:
        """On the pool: `then([task])` (its adapters fetched, its `processing` report), and what
        that returns to `ready` (none when it failed: the caller's room changed all the same)."""
        self.ledger.advance(task, Stage.FETCH)  # a download's deadline, not the text check's
        with self._lock:
            self._fetching += 1
        self._pool.submit(then, [task]).add_done_callback(lambda done: self._fetched(task, done, ready))

    def with_adapters(self, tasks: list[Task]) -> list[Task]:
        """Each task's adapters in the node's cache, their sha256 in its job (every rank loads that
        file); those whose adapters cannot be had were failed and reported."""
        out = []
        for task in tasks:
            if not task.job.loras:
                out.append(task)
                continue
            t0 = time.perf_counter()
            try:
                refs = tuple(ref.model_copy(update={"sha256": self.cache.get(Source(ref.source, ref.field),
                                                                             ref.sha256).sha256})
                             for ref in task.job.loras)
            except AdapterRefused as e:
                self.reporter.fail(task, ErrorCode.INVALID_REQUEST, str(e), retryable=False)
                continue
            except AdapterUnavailable as e:
                self.reporter.fail(task, ErrorCode.ADAPTER_UNAVAILABLE, str(e), retryable=True)
                continue
            task.job = task.job.model_copy(update={"loras": refs})
            task.timings.record(adapters=(time.perf_counter() - t0) * 1e3)
            out.append(task)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _fetched(self, task: Task, done: Future, ready: Callable[[list[Task]], None] | None) -> None:
        try:
            admitted = done.result()
        except BaseException as e:  # a bug, or the pool shut down: the task goes back to the queue
            log.exception("fetching the adapters of %s failed", task.id)
            self.reporter.fail(task, ErrorCode.ADAPTER_UNAVAILABLE, f"{type(e).__name__}: {e}", retryable=True)
            admitted = []
        finally:
            with self._lock:
                self._fetching -= 1
        if ready is not None:
            ready(admitted)
