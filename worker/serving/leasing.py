"""Leases for the intake thread (in exchanges, worker.serving.exchange, or lease calls): one long poll at a time, registering again when the scheduler has
forgotten this worker, and backing off while the queue is down (honouring a 429's Retry-After)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from protocol import Lease
from worker.config import QueueConfig
from worker.serving.exchange import Exchanger, NoExchange
from worker.serving.queue_client import AuthError, NotFound, QueueClient, QueueError, backoff
from worker.serving.registration import FatalQueueError, Registration
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)


def _worth_retrying(e: BaseException) -> bool:
    # NotFound needs a registration first; AuthError will not change by waiting.
    return isinstance(e, QueueError) and not isinstance(e, (NotFound, AuthError))


class Leaser:
    def __init__(self, client: QueueClient, registration: Registration, state: WorkerState,
                 cfg: QueueConfig, stop: threading.Event, exchanger: Exchanger | None = None) -> None:
        self._client = client
        self._registration = registration
        self._state = state
        self._cfg = cfg
        self._stop = stop  # draining: no new leases, and no more waiting for the queue
        self._exchanger = exchanger  # set: leases come in exchanges (worker.serving.exchange)

    def lease(self, n: int, hungry: bool = True, wake: Callable[[], bool] = lambda: False) -> list[Lease]:
        """Up to n leases (the long poll may return fewer or none); [] when the scheduler forgot
        this worker (the next call registers again) or when stopping while the queue is down. Not
        `hungry` (a round is still ready), the request waits up to queue.lease_hold_s, or until
        `wake()`, for a report's exchange to carry it."""
        self._registration.ensure()
        retrying = Retrying(retry=retry_if_exception(_worth_retrying),
                            wait=backoff(wait_exponential(multiplier=0.5, max=self._cfg.idle_backoff_max_s),
                                         self._cfg.idle_backoff_max_s),
                            sleep=self._stop.wait, stop=lambda _: self._stop.is_set(),
                            before_sleep=_log_backoff, reraise=True)
        worker_id = self._registration.worker_id
        models = self._state.models  # what it holds right now: the scheduler routes by it
        resident = models.resident if models else None
        adapters = self._state.adapters  # the sets of adapters it holds loaded: routed by too
        n = min(n, self._cfg.max_tasks)
        ex = self._exchanger
        try:
            if ex is not None and ex.enabled:
                if not hungry and self._cfg.lease_hold_s > 0:
                    got = ex.hold(n, resident, self._cfg.lease_hold_s, lambda: wake() or self._stop.is_set(), adapters)
                    if got is not None:
                        return got
                leases = retrying(ex.ask, n, self._cfg.lease_wait_s, resident, self._cfg.report_deadline_s, adapters)
            else:
                leases = retrying(self._client.lease, worker_id, n, self._cfg.lease_wait_s, resident, adapters)
        except NoExchange:  # an older scheduler: the next call is a lease call
            return []
        except NotFound:
            self._state.forgotten(worker_id)
            return []
        except AuthError as e:
            raise FatalQueueError(str(e)) from e
        except QueueError:  # stopping while the queue is down: the drain goes on without new leases
            return []
        return leases  # held (renewed by the heartbeat) once the admission begins each

    def wake(self) -> None:
        """Ends a request held for a report's exchange when its `wake` says so."""
        if self._exchanger is not None:
            self._exchanger.wake()


def _log_backoff(state: RetryCallState) -> None:
    log.warning("lease failed (%s); next try in %.1fs", state.outcome.exception(), state.next_action.sleep)
