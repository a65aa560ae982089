"""Leases for the intake thread: one long poll at a time, registering again when the scheduler has
forgotten this worker, and backing off while the queue is down (honouring a 429's Retry-After)."""

from __future__ import annotations

import logging
import threading

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from protocol import Lease
from worker.config import QueueConfig
from worker.serving.queue_client import AuthError, NotFound, QueueClient, QueueError, backoff
from worker.serving.registration import FatalQueueError, Registration
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)


def _worth_retrying(e: BaseException) -> bool:
    # NotFound needs a registration first; AuthError will not change by waiting.
    return isinstance(e, QueueError) and not isinstance(e, (NotFound, AuthError))


class Leaser:
    def __init__(self, client: QueueClient, registration: Registration, state: WorkerState,
                 cfg: QueueConfig, stop: threading.Event) -> None:
        self._client = client
        self._registration = registration
        self._state = state
        self._cfg = cfg
        self._stop = stop  # draining: no new leases, and no more waiting for the queue

    def lease(self, n: int) -> list[Lease]:
        """Up to n leases (the long poll may return fewer or none); [] when the scheduler forgot
        this worker (the next call registers again) or when stopping while the queue is down."""
        self._registration.ensure()
        retrying = Retrying(retry=retry_if_exception(_worth_retrying),
                            wait=backoff(wait_exponential(multiplier=0.5, max=self._cfg.idle_backoff_max_s),
                                         self._cfg.idle_backoff_max_s),
                            sleep=self._stop.wait, stop=lambda _: self._stop.is_set(),
                            before_sleep=_log_backoff, reraise=True)
        worker_id = self._registration.worker_id
        try:
            models = self._state.models  # what it holds right now: the scheduler routes by it
            leases = retrying(self._client.lease, worker_id, min(n, self._cfg.max_tasks),
                              self._cfg.lease_wait_s, models.resident if models else None)
        except NotFound:
            self._state.forgotten(worker_id)
            return []
        except AuthError as e:
            raise FatalQueueError(str(e)) from e
        except QueueError:  # stopping while the queue is down: the drain goes on without new leases
            return []
        return leases  # held (renewed by the heartbeat) once the admission begins each


def _log_backoff(state: RetryCallState) -> None:
    log.warning("lease failed (%s); next try in %.1fs", state.outcome.exception(), state.next_action.sleep)
