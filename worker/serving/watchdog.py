"""Rank 0's watchdog: a thread that holds every stage to its deadline ([deadlines]).

- A task whose stage passes its deadline is overdue (the ledger drops whatever the stage produces
  later) and failed retryable at once (deadline_exceeded), so its lease ends now instead of being
  renewed while nothing moves. A store that hangs, a check that never returns, a generation stuck on
  a device: each fails its task within its deadline, and another attempt runs it.
- A serve loop that finishes no turn for `stall_s` is stuck (a hung collective, a device that stopped
  answering): the tasks held are abandoned and given back (released when never started, failed
  retryable otherwise) and the process exits non-zero at once, so torchrun restarts the group.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from protocol import ErrorCode
from telemetry.stacks import thread_stacks
from worker.serving.ledger import Held, Ledger
from worker.serving.reporter import Reporter
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)

GIVE_BACK_S = 5.0  # per report when giving tasks back on the way out: the exit must not wait long
STALLED_EXIT = 5


class Watchdog(threading.Thread):
    def __init__(self, state: WorkerState, ledger: Ledger, reporter: Reporter, stall_s: float,
                 exit: Callable[[int], None] = os._exit, tick_s: float = 0.25) -> None:
        super().__init__(name="watchdog", daemon=True)
        self._state = state
        self._ledger = ledger
        self._reporter = reporter
        self._stall_s = stall_s  # deadlines.stall_s
        self._exit = exit
        self._tick_s = tick_s
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self._tick_s):
            if self.check():
                return

    def check(self) -> bool:
        """One pass; True when the serve loop stalled (the tasks were given back, exit was called)."""
        if self._state.idle_s() > self._stall_s:  # first: a stall gives back every task
            self._stalled()
            return True
        for held in self._ledger.overdue():
            self._expire(held)
        return False

    def _expire(self, held: Held) -> None:
        field = held.stage.field
        log.error("task %s: stage %s passed its deadline (deadlines.%s = %gs); failing it for a retry",
                  held.task.id, held.stage, field, held.limit_s,
                  extra=held.task.fields(stage=str(held.stage), error_code=str(ErrorCode.DEADLINE_EXCEEDED)))
        self._reporter.fail(held.task, ErrorCode.DEADLINE_EXCEEDED,
                            f"stage {held.stage} took longer than {held.limit_s:g}s (deadlines.{field})",
                            retryable=True)

    def _stalled(self) -> None:
        held = self._ledger.abandon_all()
        log.critical("the serve loop made no progress for %.0fs (deadlines.stall_s); giving back %d task(s) "
                     "and exiting so the group is restarted. Every thread's stack:\n%s", self._state.idle_s(),
                     len(held), thread_stacks())
        for h in held:
            if not h.stage.started:  # the attempt does not count
                self._reporter.release(h.task, deadline_s=GIVE_BACK_S)
            else:
                self._reporter.fail(h.task, ErrorCode.DEADLINE_EXCEEDED,
                                    f"the worker's serve loop stalled in stage {h.stage}",
                                    retryable=True, deadline_s=GIVE_BACK_S)
        logging.shutdown()
        self._exit(STALLED_EXIT)
