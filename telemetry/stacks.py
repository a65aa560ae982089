"""Every thread's stack, as an operator reads it in the log of a process that is about to exit because
something stopped moving (the scheduler's stuck event loop, the worker's stalled serve loop)."""

from __future__ import annotations

import sys
import threading
import traceback


def thread_stacks() -> str:
    """Each live thread's name and id, then its stack, innermost call last (as a traceback reads)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident}):\n{stack}')
    return "\n".join(parts)
