"""This worker's registration with the scheduler, and the heartbeat thread that keeps it and its
leases alive. When the scheduler has forgotten the worker (a 404, e.g. a fresh database), it
registers again with the same description. The registration names the node (DistContext.node_id),
so after a torchrun restart the scheduler requeues what the dead group held without waiting for
its leases to expire, and the limits the worker validates inputs against, so the scheduler refuses
at submission what no live worker accepts. At the end of a clean drain, `leave` sends the last
heartbeat, `drained`: the scheduler then shows the worker as gone on purpose, not `lost`."""

from __future__ import annotations

import logging
import socket
import threading
from importlib import metadata

from protocol import DeviceInfo, RegisterWorker, WorkerLimits
from worker.serving.heartbeat import HeartbeatThread
from worker.serving.ledger import Ledger
from worker.serving.queue_client import AuthError, QueueClient
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)

# Generous: the scheduler may be restarting while this node boots.
REGISTER_DEADLINE_S = 300.0


class FatalQueueError(RuntimeError):
    """The scheduler refuses this worker (auth); serving cannot go on."""


class Registration:
    def __init__(self, client: QueueClient, state: WorkerState, ledger: Ledger, heartbeat_interval_s: float,
                 world_size: int, model: str, node_id: str | None = None,
                 limits: WorkerLimits | None = None) -> None:
        self._client = client
        self._state = state
        self._ledger = ledger  # what the heartbeat renews and counts
        self._interval_s = heartbeat_interval_s
        self._world_size = world_size
        self._model = model
        self._node_id = node_id  # lets the scheduler requeue what this node's previous group held
        self._limits = limits  # lets the scheduler refuse at submission what this worker would refuse
        self._info: RegisterWorker | None = None
        self._heartbeat: HeartbeatThread | None = None
        self.worker_id = ""
        self.ops_url: str | None = None  # where the scheduler's page and Prometheus find this worker

    def register(self, devices: list[DeviceInfo], interrupt: threading.Event | None = None) -> None:
        """Raises Interrupted when `interrupt` is set while the scheduler does not answer, and
        Unavailable (naming its URL) when it has not answered for REGISTER_DEADLINE_S."""
        self._info = RegisterWorker(hostname=socket.gethostname(), world_size=self._world_size,
                                    devices=devices, model=self._model, version=_version(),
                                    node_id=self._node_id, ops_url=self.ops_url, limits=self._limits)
        self._register(interrupt)

    def ensure(self) -> None:
        """Registers again if the heartbeat or a lease call found this registration unknown."""
        if self._state.take_forgotten(self.worker_id):
            self._register()

    def close(self) -> None:
        if self._heartbeat:
            self._heartbeat.stop()

    def leave(self) -> bool:
        """A clean drain has ended: stops the heartbeat and says `drained`. False when the scheduler
        could not be told (it marks the worker `lost` after its liveness time, as after a crash)."""
        return self._heartbeat.farewell() if self._heartbeat else False

    def _register(self, interrupt: threading.Event | None = None) -> None:
        self._info = self._info.model_copy(update={"models": self._state.models})  # as they are now
        try:
            reg = self._client.register(self._info, deadline_s=REGISTER_DEADLINE_S, interrupt=interrupt)
        except AuthError as e:
            raise FatalQueueError(str(e)) from e
        self.worker_id = reg.worker_id
        log.info("registered as %s (lease ttl %.0fs)", reg.worker_id, reg.lease_ttl_s)
        if self._heartbeat is None:
            self._heartbeat = HeartbeatThread(self._client, self.worker_id, self._state, self._ledger,
                                              self._interval_s)
            self._heartbeat.start()
        else:
            self._heartbeat.worker_id = self.worker_id


def _version() -> str:
    try:
        return metadata.version("dit-worker")
    except metadata.PackageNotFoundError:
        return "0+unknown"
