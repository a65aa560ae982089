"""The event loop's watchdog. Every request is served by one event loop, so a loop that stops turning
(waiting for a lock, a future or a thread that only it could release, or a call that never returns)
stops the whole scheduler while its process looks alive. A beat on the loop notes each time it runs
and how late (the loop's lag, a metric); a thread of its own checks the last beat, and when the
loop has not turned for `server.stuck_loop_s` it logs every thread's stack and exits with
STALLED_EXIT, which the supervisor restarts (launch/systemd/dit-scheduler.service). Nothing is lost
by the exit: an answer a client got was committed first, and leases make the queue retry the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable

from telemetry.stacks import thread_stacks

log = logging.getLogger(__name__)

STALLED_EXIT = 5  # as the worker's stalled serve loop: restart it (not 2, a setting that cannot work)
LOG_S = 5.0  # the stacks are written within this, or the exit goes ahead without them


class LoopWatch:
    def __init__(self, stuck_s: float, *, on_lag: Callable[[float], None] | None = None, tick_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, exit: Callable[[int], None] = os._exit) -> None:
        """`stuck_s`: the loop not turning this long is stuck (0: only the lag is measured);
        `on_lag(seconds)`: how late each beat ran; `exit`: how the process ends (tests inject it)."""
        self._stuck_s = stuck_s
        self._on_lag = on_lag
        self._tick_s = tick_s
        self._clock = clock
        self._exit = exit
        self._last = clock()
        self._halt = threading.Event()

    async def run(self) -> None:
        """On the loop, until cancelled: the beat, with the watching thread beside it."""
        self._last = self._clock()
        watcher = None
        if self._stuck_s > 0:
            watcher = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
            watcher.start()
        try:
            while True:
                before = self._clock()
                await asyncio.sleep(self._tick_s)
                self._last = now = self._clock()
                if self._on_lag is not None:
                    self._on_lag(max(0.0, now - before - self._tick_s))
        finally:
            self._halt.set()

    def _watch(self) -> None:
        while not self._halt.wait(self._tick_s):
            if self.check():
                return

    def check(self) -> bool:
        """One look, on the watching thread; True when the loop was stuck (exit was called)."""
        quiet = self._clock() - self._last
        if quiet <= self._stuck_s:
            return False
        last_words("the event loop has not turned for %.1fs (server.stuck_loop_s = %gs): exiting %d for a restart",
                   quiet, self._stuck_s, STALLED_EXIT)
        self._exit(STALLED_EXIT)
        return True


def last_words(msg: str, *args: object) -> None:
    """`msg` and every thread's stack, logged critical and flushed before the process exits; within
    LOG_S at most: the thread that stopped may hold a handler's lock (a log pipe nobody reads), and the
    exit must not wait for it."""
    stacks = thread_stacks()

    def tell() -> None:
        log.critical(msg + ". Every thread's stack:\n%s", *args, stacks)
        for handler in logging.getLogger().handlers:
            handler.flush()

    teller = threading.Thread(target=tell, name="last-words", daemon=True)
    teller.start()
    teller.join(LOG_S)
