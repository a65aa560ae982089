"""The heartbeat when the scheduler does not answer: stopping the thread ends its retries at once,
rather than after the beat's deadline (one interval), so nothing is sent after the worker stops."""

from __future__ import annotations

import logging
import threading

from launch.local import free_port
from worker.config import QueueConfig
from worker.serving.heartbeat import HeartbeatThread
from worker.serving.ledger import Counter, Ledger
from worker.serving.queue_client import QueueClient
from worker.serving.state import WorkerState


class _Seen(logging.Handler):
    """Sets an event when the client logs that it will retry."""

    def __init__(self) -> None:
        super().__init__()
        self.retrying = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "did not answer" in record.getMessage():
            self.retrying.set()


def test_a_stopped_heartbeat_stops_retrying_a_beat_nobody_answers():
    client = QueueClient(QueueConfig(url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5), token=None)
    seen = _Seen()
    logging.getLogger("worker.serving.queue_client").addHandler(seen)
    ledger = Ledger()
    hb = HeartbeatThread(client, "w-1", WorkerState(), ledger, interval_s=120)
    try:
        hb.start()
        assert seen.retrying.wait(30), "the first beat was never retried"
        hb.stop()
        hb.join(30)
        assert not hb.is_alive()  # before: retried until its deadline, the 120 s interval
        assert ledger.counters.get(Counter.HEARTBEAT_FAILURES) == 0  # stopped, not failed
    finally:
        logging.getLogger("worker.serving.queue_client").removeHandler(seen)
        client.close()
