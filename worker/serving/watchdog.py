"""Rank 0's watchdog: a thread that holds every stage to its deadline ([deadlines]).

- A task whose stage passes its deadline is abandoned (whatever the stage produces later is dropped)
  and failed retryable at once (deadline_exceeded), so its lease ends now instead of being renewed
  while nothing moves. A store that hangs, a check that never returns, a generation stuck on a
  device: each fails its task within its deadline, and another attempt runs it.
- A serve loop that finishes no turn for `stall_s` is stuck (a hung collective, a device that stopped
  answering): the tasks held are given back (released when never started, failed retryable
  otherwise) and the process exits non-zero at once, so torchrun restarts the group.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from protocol import ErrorCode
from worker.config import DeadlinesConfig
from worker.serving.heartbeat import Held, WorkerState
from worker.serving.reporter import Reporter

log = logging.getLogger(__name__)

# Each stage's deadline, by the config field that sets it.
FIELDS = {"admit": "admit_s", "ready": "stall_s", "generate": "generate_s", "check": "check_s",
          "encode": "encode_s", "store": "store_s", "report": "report_s"}
GIVE_BACK_S = 5.0  # per report when giving tasks back on the way out: the exit must not wait long
STALLED_EXIT = 5


class Watchdog(threading.Thread):
    def __init__(self, state: WorkerState, reporter: Reporter, deadlines: DeadlinesConfig,
                 exit: Callable[[int], None] = os._exit, tick_s: float = 0.25) -> None:
        super().__init__(name="watchdog", daemon=True)
        self._state = state
        self._reporter = reporter
        self._deadlines = deadlines
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
        if self._state.idle_s() > self._deadlines.stall_s:  # first: a stall gives back every task
            self._stalled()
            return True
        for held in self._state.overdue():
            self._expire(held)
        return False

    def _expire(self, held: Held) -> None:
        held.task.abandoned = True
        field = FIELDS.get(held.stage, held.stage)
        log.error("task %s: stage %s passed its deadline (deadlines.%s = %gs); failing it for a retry",
                  held.task.id, held.stage, field, held.limit_s,
                  extra=held.task.fields(stage=held.stage, error_code=str(ErrorCode.DEADLINE_EXCEEDED)))
        self._reporter.fail(held.task, ErrorCode.DEADLINE_EXCEEDED,
                            f"stage {held.stage} took longer than {held.limit_s:g}s (deadlines.{field})",
                            retryable=True)

    def _stalled(self) -> None:
        log.critical("the serve loop made no progress for %.0fs (deadlines.stall_s); giving back %d task(s) "
                     "and exiting so the group is restarted", self._state.idle_s(), len(self._state.held()))
        for held in self._state.held():
            held.task.abandoned = True
            if held.stage in ("admit", "ready"):  # never started: the attempt does not count
                self._reporter.release(held.task, deadline_s=GIVE_BACK_S)
            else:
                self._reporter.fail(held.task, ErrorCode.DEADLINE_EXCEEDED,
                                    f"the worker's serve loop stalled in stage {held.stage}",
                                    retryable=True, deadline_s=GIVE_BACK_S)
        logging.shutdown()
        self._exit(STALLED_EXIT)
