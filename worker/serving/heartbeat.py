"""Rank 0's heartbeat: a daemon thread that never waits on the GPU.

It reports the worker's status, in-flight task ids, warnings and counters every interval, which renews
their leases on the scheduler, but only for tasks whose stage is within its deadline (the ledger
decides which): a task that stopped moving is not kept alive. The reply names leases this worker has
lost and tasks a client cancelled; it tells the ledger, which decides what becomes of them.
A status change (e.g. to "ready") is sent at once rather than at the next tick. At the end of a
clean drain, `farewell` stops the thread and sends the last heartbeat, status "drained".
"""

from __future__ import annotations

import logging
import threading
import time

from protocol import Heartbeat, RegistrationStatus
from worker.serving.ledger import Counter, Ledger
from worker.serving.queue_client import AuthError, Interrupted, NotFound, QueueClient, QueueError
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)


class HeartbeatThread(threading.Thread):
    def __init__(self, client: QueueClient, worker_id: str, state: WorkerState, ledger: Ledger,
                 interval_s: float) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._client = client
        self.worker_id = worker_id
        self._state = state
        self._ledger = ledger
        self._interval = interval_s
        self._halt = threading.Event()
        self.beats = 0

    def stop(self) -> None:
        self._halt.set()
        self._state.changed.set()

    def farewell(self) -> bool:
        """The last heartbeat, once a drain has finished the tasks: status `drained`, so the scheduler
        closes the registration instead of marking the worker `lost` when the beats stop. The thread
        is stopped first so that no `draining` beat follows (the scheduler would refuse it anyway).
        True when the scheduler will not show it `lost`."""
        self.stop()
        if self.is_alive():
            self.join(2 * self._interval)  # a beat under way stops retrying; one in flight ends within its timeout
        self._state.set_status(RegistrationStatus.DRAINED)
        try:
            self._client.heartbeat(self.worker_id, self.message(), deadline_s=self._interval)
        except NotFound:  # a retry after a lost answer, or a scheduler that forgot it: nothing to mark lost
            log.info("the scheduler already holds no live registration of worker %s", self.worker_id)
            return True
        except QueueError as e:  # leaving anyway: the scheduler's liveness time covers it, as for a crash
            log.warning("could not tell the scheduler that worker %s drained: %s", self.worker_id, e)
            return False
        log.info("told the scheduler that worker %s drained", self.worker_id)
        return True

    def run(self) -> None:
        next_beat = 0.0
        while not self._halt.is_set():
            # Wake at the interval or at once on a status change, whichever comes first.
            self._state.changed.wait(timeout=max(0.0, next_beat - time.monotonic()))
            self._state.changed.clear()
            if self._halt.is_set():
                break
            self.beat()
            next_beat = time.monotonic() + self._interval

    def message(self) -> Heartbeat:
        """What the next heartbeat says."""
        return Heartbeat(status=self._state.status, in_flight=self._ledger.in_flight(), timestamp=time.time(),
                         warnings=list(self._state.warnings), counters=self._ledger.counters.as_wire(),
                         safety_policy=self._state.safety_policy, models=self._state.models)

    def beat(self) -> None:
        hb, worker_id = self.message(), self.worker_id
        try:
            # Retries stay within one interval so beats never pile up behind each other, and end
            # when the thread is stopped: a stopped worker's client may be closed under them.
            reply = self._client.heartbeat(worker_id, hb, deadline_s=self._interval, interrupt=self._halt)
        except Interrupted:
            log.debug("heartbeat retries stopped with the thread")
        except NotFound:
            log.error("scheduler does not know worker %s", worker_id)  # the serve loop registers again if current
            self._state.forgotten(worker_id)
        except AuthError as e:
            self._ledger.counters.add(Counter.HEARTBEAT_FAILURES)
            log.error("heartbeat refused: %s", e)
        except QueueError as e:
            self._ledger.counters.add(Counter.HEARTBEAT_FAILURES)
            log.warning("heartbeat failed after retries: %s", e)
        else:
            self.beats += 1
            if reply.lost:
                log.warning("leases lost on %s", ", ".join(reply.lost))
                self._ledger.mark_lost(reply.lost)
            if reply.cancelled and (fresh := self._ledger.mark_cancelled(reply.cancelled)):
                log.info("cancelled by a client: %s", ", ".join(fresh))
