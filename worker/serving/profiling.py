"""On-demand traces of rank 0's serve loop: `POST /profile?rounds=N` on the operator endpoint
(`ops.profile_dir` set) arms it; the serve loop starts `torch.profiler` before its next round and
stops it after N rounds, so the trace holds every thread of rank 0 (generation, the intake's text
checks, the post pool's image checks and encoding) and every CUDA stream's kernels over N rounds of
live traffic. Writing the trace happens on a thread of its own, never in the serve loop.

    state    idle -> armed -> running -> writing -> done | failed -> (armed again on request)

Each trace is `profile-<UTC time>.json.gz` (Chrome trace format: chrome://tracing, Perfetto) with a
`.txt` beside it: the operators by time spent on the device (CPU where there is none). The
profiler slows what it watches; figures in the trace are for finding where time goes, not for
throughput.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MAX_ROUNDS = 64


class ProfileBusy(RuntimeError):
    """A trace is armed, running or being written."""


class Profiler:
    def __init__(self, folder: str | Path, device: torch.device) -> None:
        self.folder = Path(folder)
        self._device = device
        self._lock = threading.Lock()
        self._state = "idle"
        self._rounds = 0
        self._done_rounds = 0
        self._trace: Path | None = None
        self._error = ""
        self._prof = None
        self._writer: threading.Thread | None = None

    # ------------------------------------------------------------ any thread (the ops endpoint)

    def request(self, rounds: int) -> Path:
        """Arms a trace of the next `rounds` rounds; the path it will be written to."""
        if not 1 <= rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds: {rounds} is not within 1..{MAX_ROUNDS}")
        with self._lock:
            if self._state in ("armed", "running", "writing"):
                raise ProfileBusy(f"a trace is {self._state}: {self._trace}")
            self.folder.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            self._trace = self.folder / f"profile-{stamp}.json.gz"
            self._state, self._rounds, self._done_rounds, self._error = "armed", rounds, 0, ""
            return self._trace

    def status(self) -> dict:
        with self._lock:
            return {"state": self._state, "trace": str(self._trace or ""), "rounds": self._rounds,
                    "rounds_done": self._done_rounds, "error": self._error}

    # ------------------------------------------------------------ the serve loop's thread

    def before_round(self) -> None:
        with self._lock:
            if self._state != "armed":
                return
            self._state = "running"
        try:
            self._prof = _start_profiler(self._device)
        except Exception as e:  # a profiler that cannot start fails the trace, never the loop
            self._fail(f"could not start the profiler: {type(e).__name__}: {e}")

    def after_round(self) -> None:
        if self._prof is None:
            return
        with self._lock:
            self._done_rounds += 1
            if self._done_rounds < self._rounds:
                return
        self.finish()

    def finish(self) -> None:
        """Stops a running trace (the loop ends, or its rounds are done) and writes it on a thread."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        try:
            prof.stop()
        except Exception as e:
            self._fail(f"could not stop the profiler: {type(e).__name__}: {e}")
            return
        with self._lock:
            self._state = "writing"
        self._writer = threading.Thread(target=self._write, args=(prof,), name="profile-writer", daemon=True)
        self._writer.start()

    def join(self, timeout: float) -> None:
        if self._writer is not None:
            self._writer.join(timeout)

    # ------------------------------------------------------------ the writer's thread

    def _write(self, prof) -> None:
        trace = self._trace
        assert trace is not None
        try:
            prof.export_chrome_trace(str(trace))  # a .gz path: torch writes it gzipped
            sort = "self_device_time_total" if self._device.type == "cuda" else "self_cpu_time_total"
            table = prof.key_averages().table(sort_by=sort, row_limit=40)
            trace.with_name(trace.name.replace(".json.gz", ".txt")).write_text(table + "\n")
        except Exception as e:
            self._fail(f"could not write {trace}: {type(e).__name__}: {e}")
            return
        with self._lock:
            self._state = "done"
        log.info("profile of %d round(s) written: %s", self._done_rounds, trace)

    def _fail(self, why: str) -> None:
        log.warning("profile: %s", why)
        with self._lock:
            self._state, self._error = "failed", why


def _start_profiler(device: torch.device):
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:  # every thread's operators, not only the serve loop's (torch 2.6+)
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        config = None
    prof = profile(activities=activities, experimental_config=config) if config else profile(activities=activities)
    prof.start()
    return prof
