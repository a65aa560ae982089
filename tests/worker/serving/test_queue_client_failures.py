"""A scheduler that does not answer: every retry's log names its URL, and a stop at start-up ends
the registration's retries at once instead of after its five-minute deadline."""

from __future__ import annotations

import logging
import threading

import httpx
import pytest

from protocol import DeviceInfo, RegisterWorker
from worker.config import QueueConfig
from worker.serving.queue_client import Interrupted, QueueClient, Unavailable

INFO = RegisterWorker(hostname="h", world_size=1, devices=[DeviceInfo(name="cpu", memory_bytes=1)], model="m",
                      version="v")


def refusing() -> QueueClient:
    def handle(request: httpx.Request):
        raise httpx.ConnectError("connection refused", request=request)

    return QueueClient(QueueConfig(url="http://queue.example:8700", timeout_s=1.0), token=None,
                       transport=httpx.MockTransport(handle))


class StopOnRetry(logging.Handler):
    """Sets the stop event when the first retry is logged: a signal arriving mid-wait, without a sleep."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self.event, self.lines = event, []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.event.set()


def test_a_stop_ends_the_registration_retries_and_the_log_names_the_url():
    stop = threading.Event()
    handler = StopOnRetry(stop)
    log = logging.getLogger("worker.serving.queue_client")
    log.addHandler(handler)
    try:
        with pytest.raises(Interrupted, match=r"stopped while retrying: POST http://queue.example:8700/v1/workers"):
            refusing().register(INFO, deadline_s=300.0, interrupt=stop)
    finally:
        log.removeHandler(handler)
    [line] = handler.lines  # one retry logged, then the stop ended it
    assert line.startswith("the scheduler at http://queue.example:8700 did not answer (POST http://queue.example:8700"
                           "/v1/workers: ConnectError: connection refused); retry 1 in ")
    assert line.endswith("giving up after 300s")


def test_without_a_stop_the_deadline_ends_it_with_the_url():
    with pytest.raises(Unavailable, match=r"POST http://queue.example:8700/v1/workers: ConnectError"):
        refusing().register(INFO, deadline_s=0.0)
