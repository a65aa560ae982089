"""The log format: one JSON object per line with the event's fields, or text on a terminal."""

from __future__ import annotations

import importlib
import io
import json
import logging

import pytest

from telemetry import logs


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_root():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_event_fields_and_the_process_fields():
    out = io.StringIO()
    logs.configure("INFO", "auto", stream=out, rank=3)  # not a terminal: JSON
    log = logging.getLogger("worker.serving.reporter")
    log.info("task %s failed: %s", "t-1", "unsafe_prompt",
             extra={"task_id": "t-1", "attempt": 2, "stage": "admit", "error_code": "unsafe_prompt",
                    "duration_ms": 12.5})
    try:
        raise ValueError("boom \u00e9")
    except ValueError:
        log.exception("post-processing failed", extra={"task_id": "t-2"})
    logging.getLogger("httpx").info("HTTP Request: chatter")  # quieted to WARNING
    first, second = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {k: first[k] for k in ("level", "logger", "msg", "rank", "task_id", "attempt", "stage",
                                  "error_code", "duration_ms")} == {
        "level": "INFO", "logger": "worker.serving.reporter", "msg": "task t-1 failed: unsafe_prompt", "rank": 3,
        "task_id": "t-1", "attempt": 2, "stage": "admit", "error_code": "unsafe_prompt", "duration_ms": 12.5}
    assert isinstance(first["ts"], float)
    assert second["level"] == "ERROR" and "ValueError: boom \u00e9" in second["exc"] and "stage" not in second


def test_text_on_a_terminal_and_when_asked():
    tty = Tty()
    logs.configure("INFO", "auto", stream=tty, rank=0)
    logging.getLogger("worker").info("task t-1 succeeded", extra={"task_id": "t-1", "stage": "report"})
    line = tty.getvalue().strip()
    assert " rank0 INFO worker: task t-1 succeeded [stage=report]" in line and not line.startswith("{")
    out = io.StringIO()
    logs.configure("INFO", "text", stream=out)
    logging.getLogger("scheduler").warning("plain")
    assert out.getvalue().rstrip().endswith("WARNING scheduler: plain")


def test_configuring_again_replaces_the_handler_rather_than_doubling_lines():
    out = io.StringIO()
    logs.configure("INFO", "json", stream=io.StringIO())
    logs.configure("INFO", "json", stream=out)
    logging.getLogger("x").info("once")
    assert len(out.getvalue().splitlines()) == 1


@pytest.mark.parametrize("library", ["transformers", "diffusers"])
def test_a_library_with_a_handler_of_its_own_logs_in_the_entry_points_format(library, capfd):
    own = importlib.import_module(f"{library}.utils.logging")
    out = io.StringIO()
    logs.configure("INFO", "json", stream=out, rank=1)
    logs.route_library_logs()
    try:
        own.get_logger(f"{library}.somewhere").warning("`CLIPImageProcessor` requires torchvision")
        own.get_logger(f"{library}.somewhere").info("chatter")  # quieted to WARNING, as configure sets it
    finally:  # the library's own state is the process's: as it was for the other tests
        own.enable_default_handler()
        own.disable_propagation()
    line, = [json.loads(text) for text in out.getvalue().splitlines()]
    assert line["msg"] == "`CLIPImageProcessor` requires torchvision" and line["level"] == "WARNING"
    assert line["logger"] == f"{library}.somewhere" and line["rank"] == 1
    assert "requires torchvision" not in capfd.readouterr().err  # not also printed by its own handler
