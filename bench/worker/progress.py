"""The benchmark's running account: each phase prints when it starts and when it ends, with the
time since the run began and the phase's own duration, and the JSON report is rewritten (atomically)
after every phase, so a run stopped by a time limit keeps everything it finished.

A top-level phase may have a time limit: SIGALRM raises PhaseTimeout in the main thread, the phase
is recorded as timed out, and the run goes on with the next phase. SIGTERM ends the run the same
way (Interrupted), after recording and saving, so the processes a phase started are stopped by its
own cleanup. A phase that fails is recorded with its error and the run goes on; the exit code says
whether every phase succeeded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO


class PhaseTimeout(Exception):
    """A phase ran past its time limit."""


class Interrupted(BaseException):
    """SIGTERM: stop after saving what was measured. A BaseException so that no phase swallows it."""


class Progress:
    def __init__(self, report: dict, path: Path, clock: Callable[[], float] = time.monotonic,
                 stream: TextIO = sys.stdout) -> None:
        self.report = report
        self.path = path
        self.clock = clock
        self.stream = stream
        self.t0 = clock()
        self.failed = 0
        self._depth = 0
        self._starts: dict[int, float] = {}  # id(record) -> clock at its start
        self._open_names: list[str] = []  # the phase, then its step
        report.setdefault("phases", [])
        report["status"] = "running"
        self.save()

    @contextlib.contextmanager
    def phase(self, name: str, limit_s: float = 0.0) -> Iterator[dict]:
        """A top-level phase: limited to `limit_s` (0: no limit); a failure or a timeout is recorded
        and not raised, so the next phase runs. The yielded dict is the phase's record."""
        record = self._open(name)
        previous = signal.signal(signal.SIGALRM, _on_alarm) if limit_s else None
        if limit_s:
            record["limit_s"] = limit_s
            signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            yield record
        except PhaseTimeout:
            self._close(record, "timed out", f"past its limit of {limit_s:g}s")
        except Exception as e:
            self._close(record, "failed", f"{type(e).__name__}: {e}", traceback.format_exc())
        except BaseException as e:  # Interrupted, KeyboardInterrupt: record, then stop the run
            self._close(record, "interrupted", type(e).__name__)
            raise
        else:
            self._close(record, "ok")
        finally:
            if limit_s:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[dict]:
        """A part of a phase (load, warm-up, measure): printed and recorded; errors go to the phase."""
        record = self._open(name)
        try:
            yield record
        except BaseException as e:
            self._close(record, "failed", f"{type(e).__name__}: {e}", quiet=True)
            raise
        self._close(record, "ok")

    def finish(self, status: str = "done") -> None:
        self.report["status"] = status
        self.save()

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.clock() - self.t0, 3)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=2))
        os.replace(tmp, self.path)  # a reader, or a kill mid-write, never sees half a file

    def say(self, text: str) -> None:
        print(f"[{self.clock() - self.t0:8.1f}s] {'  ' * self._depth}{text}", file=self.stream, flush=True)

    def _open(self, name: str) -> dict:
        record = {"phase": name, "status": "running", "started_s": round(self.clock() - self.t0, 3)}
        if self._open_names:
            record["in"] = self._open_names[-1]
        self._open_names.append(name)
        self.report["phases"].append(record)
        self._starts[id(record)] = self.clock()
        self.save()
        self.say(f"{name} ...")
        self._depth += 1
        return record

    def _close(self, record: dict, status: str, error: str = "", trace: str = "", quiet: bool = False) -> None:
        self._depth -= 1
        self._open_names.pop()
        record["seconds"] = round(self.clock() - self._starts.pop(id(record)), 3)
        record["status"] = status
        if error:
            record["error"] = error
        if status != "ok" and not quiet:
            self.failed += 1
            if trace:
                print(trace, file=sys.stderr, flush=True)
        self.save()  # before the line: whoever reacts to the line finds the phase saved
        self.say(f"{record['phase']}: {status} in {record['seconds']:.1f}s" + (f" ({error})" if error and not quiet else ""))


def _on_alarm(_signum, _frame):
    raise PhaseTimeout()


def on_sigterm(_signum, _frame):
    raise Interrupted()
