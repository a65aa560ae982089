"""Logging, configured once per entry point: one JSON object per line for log shippers, or
readable text when the output is a terminal.

Every line has ts, level, logger and msg; the process's own fields (e.g. rank) on every line; and
the event's fields where the call gives them with `extra=`: task_id, attempt, stage, duration_ms,
error_code, worker_id. An exception's traceback goes in `exc`.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from typing import IO, Literal

EVENT_FIELDS = ("task_id", "attempt", "stage", "status", "duration_ms", "error_code", "worker_id", "timings_ms")
# Libraries log progress bars and chatter at INFO; keep our own lines readable.
NOISY = ("httpx", "httpcore", "diffusers", "transformers", "urllib3", "onnxruntime", "uvicorn.access")

# Libraries whose loggers print through a handler of their own, propagation off: their lines
# ("[transformers] ...") would come out between the JSON ones, in no format a log shipper reads.
OWN_HANDLERS = ("transformers.utils.logging", "diffusers.utils.logging")

Format = Literal["auto", "json", "text"]


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict[str, object]) -> None:
        super().__init__()
        self._static = static

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
                "msg": record.getMessage(), **self._static}
        for name in EVENT_FIELDS:
            if (value := getattr(record, name, None)) is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self, static: dict[str, object]) -> None:
        prefix = "".join(f"{k}{v} " for k, v in static.items())
        super().__init__(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [f"{n}={getattr(record, n)}" for n in EVENT_FIELDS
                  if getattr(record, n, None) is not None and n != "task_id"]
        return f"{text} [{' '.join(fields)}]" if fields else text


def configure(level: str, fmt: Format = "auto", stream: IO[str] | None = None, **static: object) -> None:
    """The root logger's one handler. `static` fields go on every line (the worker: rank)."""
    stream = stream or sys.stderr
    as_json = fmt == "json" or (fmt == "auto" and not _is_tty(stream))
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(static) if as_json else TextFormatter(static))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def route_library_logs() -> None:
    """The lines of OWN_HANDLERS' libraries go through the root's handler, in this entry point's
    format, at the levels `configure` set. After `configure`, before those libraries log (the
    worker's model and safety checks); a library not installed is skipped."""
    for module in OWN_HANDLERS:
        try:
            library = importlib.import_module(module)
        except ImportError:
            continue
        library.disable_default_handler()
        library.enable_propagation()


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
