"""The scheduler's HTTP server: uvicorn, with the event loop's watchdog (loop_watch.py) and a stop
that ends within `server.shutdown_s` whatever clients hold open.

A stop signal (SIGTERM, SIGINT): no new connections; the calls waiting (long-polling leases, clients'
`Prefer: wait`) are answered at once with what there is; the calls in flight finish; the store's
open group commits; the process exits 0. Whatever is still running at 7/10 of `shutdown_s` is
cancelled, and should the rest still not be done at `shutdown_s`, every thread's stack is logged and
the process is cut (exit 1). A second signal cuts it at once (128 + the signal). A cut loses no
answer a client got: each was committed before it was sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

import uvicorn

from scheduler.config import ServerConfig
from scheduler.loop_watch import LoopWatch, last_words

log = logging.getLogger(__name__)

CUT_EXIT = 1  # the stop overran server.shutdown_s


def config(app, server: ServerConfig, log_level: str) -> uvicorn.Config:
    """uvicorn's settings for `app` on `server`'s address: the calls in flight get 7/10 of the stop's
    time, the store's last commit and the rest of the shutdown the remainder."""
    return uvicorn.Config(app, host=server.host, port=server.port, log_level=log_level, access_log=False,
                          log_config=None,  # uvicorn's lines go through the process's one handler
                          timeout_graceful_shutdown=round(0.7 * server.shutdown_s, 3))


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, server: ServerConfig, *, on_stop: Callable[[], None] = lambda: None,
                 on_lag: Callable[[float], None] | None = None, exit: Callable[[int], None] = os._exit) -> None:
        """`on_stop()`: called on the loop at the first stop signal (the app answers its waiting calls);
        `on_lag(seconds)`: the loop's lag, each beat."""
        super().__init__(config)
        self._settings = server
        self._on_stop = on_stop
        self._on_lag = on_lag
        self._exit = exit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline: threading.Timer | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        watch = asyncio.create_task(LoopWatch(self._settings.stuck_loop_s, on_lag=self._on_lag,
                                              exit=self._exit).run())
        try:
            await super().serve(sockets)
        finally:
            watch.cancel()
            if self._deadline is not None:
                self._deadline.cancel()

    def handle_exit(self, sig: int, frame) -> None:
        """uvicorn's signal handler, replaced: uvicorn's own raises the signal again once it has shut
        down (the process then dies of it, exit 143) and takes a second signal only for SIGINT."""
        name = signal.Signals(sig).name
        if self.should_exit:
            log.warning("%s again while stopping: exiting now", name)
            self._exit(128 + sig)
            return
        self.should_exit = True
        log.info("%s: stopping within %gs (server.shutdown_s); a second signal stops at once", name,
                 self._settings.shutdown_s)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_stop)
        self._deadline = threading.Timer(self._settings.shutdown_s, self._overran)
        self._deadline.name = "shutdown-deadline"
        self._deadline.daemon = True
        self._deadline.start()

    def _overran(self) -> None:
        last_words("still stopping after %gs (server.shutdown_s): exiting now", self._settings.shutdown_s)
        self._exit(CUT_EXIT)
