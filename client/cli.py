"""`dit`: the queue from a terminal.

    dit submit "a lighthouse at dawn" --size 1360x768 --wait -o out.png
    dit list --status queued        dit status ID          dit download ID -o out.png
    dit cancel ID                   dit watch

The scheduler's address and the client token come from --url / --token or DIT_URL / DIT_TOKEN.
What scripts read (ids, paths, URLs, `list` and `status` lines) goes to stdout as whole lines, piped
or not; messages go to stderr, and the progress of a wait only to a terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from enum import IntEnum
from pathlib import Path
from typing import get_args
from urllib.parse import urlparse

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from client.api import Client, image_path, scheduler_url
from client.errors import (ClientError, Conflict, DownloadFailed, InvalidRequest, TaskFailed, TaskNotEnded,
                           TaskNotFound)
from protocol import FINAL_STATUSES, QueueFigures, RegistrationStatus, TaskList, TaskStatus, TaskView, WorkerView

err = Console(stderr=True, soft_wrap=True)  # messages stay whole lines, to copy and grep
out = Console()

HINT_AFTER_S = 5.0  # queued this long with no ready worker: say how to get one
TERMINAL_POLL_S = 2.0  # on a terminal, the state shown is at most this old (an ended task shows at once)
# A registration's colour in `dit status`: drained is dim, since it left on purpose; the rest yellow.
WORKER_COLOUR = {RegistrationStatus.READY: "green", RegistrationStatus.LOST: "red", RegistrationStatus.DRAINED: "dim"}


class Exit(IntEnum):
    """Every command's exit status, in one place: what a script can tell apart without reading stderr."""

    OK = 0
    TASK_FAILED = 1
    USAGE = 2
    UNAVAILABLE = 3
    NOT_FOUND = 4
    DOWNLOAD_FAILED = 5
    NOT_ENDED = 124  # as timeout(1): the wait ran out, the task goes on
    INTERRUPTED = 130  # as a shell reports Ctrl-C


EXIT_MEANINGS = {
    Exit.OK: "done: the task succeeded, or the command did what it says",
    Exit.TASK_FAILED: "the task failed or was cancelled (stderr says why)",
    Exit.USAGE: "a usage error, or a request the scheduler refused as wrong (e.g. cancelling an ended task)",
    Exit.UNAVAILABLE: "the scheduler unreachable or failing past --retry-deadline, the token refused, or rate limited",
    Exit.NOT_FOUND: "no such task: a wrong id, or one removed after the scheduler's retention",
    Exit.DOWNLOAD_FAILED: "the task succeeded but its image could not be fetched or written here",
    Exit.NOT_ENDED: "the task is still queued or running: a wait ran out (--timeout, --wait-s) or it has no result yet",
    Exit.INTERRUPTED: "interrupted (Ctrl-C); the task goes on",
}

# Each error's exit status; the first match wins, so subclasses come before their bases.
EXIT_FOR: tuple[tuple[type | tuple[type, ...], Exit], ...] = (
    (TaskNotEnded, Exit.NOT_ENDED),
    (TaskFailed, Exit.TASK_FAILED),
    (TaskNotFound, Exit.NOT_FOUND),
    ((InvalidRequest, Conflict), Exit.USAGE),
    ((DownloadFailed, OSError), Exit.DOWNLOAD_FAILED),  # OSError: the output file could not be written
    (ClientError, Exit.UNAVAILABLE),  # AuthError, Unavailable, RateLimited, an answer this client does not know
)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(_values_joined(sys.argv[1:] if argv is None else argv))  # a usage error exits 2 here
    try:
        with Client(args.url, args.token, retry_deadline_s=args.retry_deadline) as dit:
            return COMMANDS[args.command](dit, args)
    except (ClientError, OSError) as e:
        return _failed(e)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


def _failed(e: Exception) -> Exit:
    code = next(code for kinds, code in EXIT_FOR if isinstance(e, kinds))
    # Text, not markup: messages quote ids, paths and the scheduler's words, which may hold [brackets].
    label = "" if code == Exit.TASK_FAILED else "error: "
    err.print(Text.assemble((label, "red"), (str(e), "red" if code == Exit.TASK_FAILED else "")))
    if isinstance(e, TaskNotEnded):
        err.print(_resume_hint(e.task.id), markup=False, highlight=False)
    return code


def _resume_hint(task_id: str) -> str:
    return (f"it goes on: `dit status {task_id}` shows it, `dit download {task_id} --wait -o FILE` fetches the "
            f"image once it has succeeded, `dit cancel {task_id}` stops it")


def _line(text: str) -> None:
    """One whole line to stdout: never cut or wrapped at the terminal's (or a pipe's 80) columns, and
    nothing in it read as markup or emoji codes."""
    out.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)


# ---------------------------------------------------------------- submit, download


def submit(dit: Client, args) -> int:
    width, height = args.size or (None, None)
    task = dit.submit(args.prompt, width=width, height=height, steps=args.steps, seed=args.seed,
                      output_format=args.format or _format_of(args.output), num_images=args.images,
                      priority=args.priority, model=args.model)
    if not (args.wait or args.output):  # a file asked for is a result waited for
        _line(task.id)
        return Exit.OK
    try:
        task = _await(dit, task, args.timeout)
    except KeyboardInterrupt:  # the task goes on: say which it is, or it is lost to its submitter
        err.print(f"interrupted: {task.id} was submitted and goes on", markup=False, highlight=False)
        err.print(_resume_hint(task.id), markup=False, highlight=False)
        raise
    if task.status != "succeeded":
        raise TaskFailed(task)
    r = task.result
    err.print(f"[green]{task.id} succeeded[/] in {task.finished_at - task.created_at:.1f}s: "
              f"{r.width}x{r.height}, seed {r.seed}")
    if args.output:
        _download_all(dit, task, args.output)
    else:
        for image in r.images or [r]:
            if getattr(image, "withheld", None) is None:
                _line(image.url or image.uri)
        _say_withheld(task)
    return Exit.OK


def download(dit: Client, args) -> int:
    """A task's images by id: after `dit submit` without --wait, or a wait that ran out."""
    task = dit.get(args.id)
    if args.wait:
        task = _await(dit, task, args.timeout)
    _download_all(dit, task, args.output or _default_name(task))
    return Exit.OK


def _download_all(dit: Client, task: TaskView, output: str) -> None:
    """Every stored image of the task: the first to `output`, image i to `<stem>~i<suffix>` beside it."""
    images = task.result.images if task.result is not None else []
    if len(images) <= 1:
        _line(str(dit.download(task, output)))
        return
    for image in images:
        if image.withheld is None:
            _line(str(dit.download(task, image_path(output, image.index), image.index)))
    _say_withheld(task)


def _say_withheld(task: TaskView) -> None:
    for image in task.result.images:
        if image.withheld is not None:
            err.print(f"image {image.index} (seed {image.seed}) withheld: {image.withheld.message}", markup=False,
                      highlight=False)


_SUFFIXES = {"image/png": ".png", "image/webp": ".webp", "image/jpeg": ".jpg"}
_FORMATS = {".png": "png", ".webp": "webp", ".jpg": "jpeg", ".jpeg": "jpeg"}


def _format_of(output: str | None) -> str | None:
    """The format `-o cat.png` names, so that a file is what its name says; None: the worker's default."""
    return _FORMATS.get(Path(output).suffix.lower()) if output else None


def _default_name(task: TaskView) -> str:
    """ID.png (or the format the task was made in) in the current folder."""
    if task.result is None:  # no image: download() says why before any file is made
        return task.id
    suffix = _SUFFIXES.get(task.result.content_type) or Path(urlparse(task.result.uri).path).suffix
    return f"{task.id}{suffix}"


def _await(dit: Client, task: TaskView, timeout_s: float) -> TaskView:
    """The task once it has ended. On a terminal, with a live view of what it is doing; piped,
    silently, so that a log holds only the result lines."""
    if not err.is_terminal:
        return dit.wait(task.id, timeout_s=timeout_s)
    view = WaitView(task)
    with Live(view, console=err, transient=True, refresh_per_second=4) as live:
        def update(t: TaskView) -> None:
            view.task = t
            if t.status == "queued":  # where it stands, and whether anything can serve it
                view.figures, view.workers = _surroundings(dit)
            live.refresh()

        try:
            update(task)
            return dit.wait(task.id, timeout_s=timeout_s, on_update=update, poll_s=TERMINAL_POLL_S)
        except BaseException:
            live.transient = False  # the last state (and hint) stays above the error
            raise


def _surroundings(dit: Client) -> tuple[QueueFigures | None, list[WorkerView] | None]:
    """The queue and the workers, for the display only: a scheduler that does not serve them (another
    implementation of the protocol) costs the display, not the wait."""
    try:
        return dit.queue(), dit.workers()
    except ClientError:
        return None, None


class WaitView:
    """What a wait shows on a terminal: seconds since it began, the task's state and worker, its
    place in the queue, and a hint when no worker is ready to serve it. rich renders it on each
    refresh, so the seconds tick between the scheduler's answers."""

    def __init__(self, task: TaskView, clock: Callable[[], float] = time.monotonic) -> None:
        self.task = task
        self.figures: QueueFigures | None = None
        self.workers: list[WorkerView] | None = None
        self._clock, self._t0 = clock, clock()
        self._spinner = Spinner("dots")  # one spinner, so that it turns instead of restarting

    def text(self) -> str:
        t = self.task
        parts = [f"{t.id}: {t.status}", f"{self._clock() - self._t0:.0f}s"]
        if t.worker_id and t.status in ("leased", "processing"):
            parts.append(f"worker {t.worker_id}")
        if t.attempts > 1:
            parts.append(f"attempt {t.attempts} of {t.max_attempts}")
        if t.status == "queued" and self.figures is not None:
            parts.append(_position(self.figures, t.priority))
        hint = self.hint()
        return " · ".join(parts) + (f"\n{hint}" if hint else "")

    def hint(self) -> str | None:
        waited = self._clock() - self._t0
        if self.task.status != "queued" or self.workers is None or waited < HINT_AFTER_S:
            return None
        if any(w.status == RegistrationStatus.READY for w in self.workers):
            return None
        starting = sum(w.status == RegistrationStatus.INITIALIZING for w in self.workers)
        note = f" ({starting} starting)" if starting else ""
        return f"no worker is ready{note}: start one with `make node` or check `dit watch`"

    def __rich__(self) -> Spinner:
        self._spinner.update(text=Text(self.text()))
        return self._spinner


def _position(q: QueueFigures, priority: int) -> str:
    """Where a queued task stands. Tasks at a higher priority are ahead of it; those at its own may
    be on either side (the figures do not say), so a range unless that is exact."""
    by = {int(p): n for p, n in q.queued_by_priority.items()}
    first = sum(n for p, n in by.items() if p > priority) + 1
    last = max(first, sum(n for p, n in by.items() if p >= priority))
    where = f"{first}" if first == last else f"{first}-{last}"
    return f"position {where} of {q.queued} queued"


# ---------------------------------------------------------------- list, status, cancel


def list_tasks(dit: Client, args) -> int:
    """One line per task, oldest first (the scheduler's order); --json: GET /v1/tasks's answer."""
    tasks = dit.list_tasks(args.status, args.limit, args.offset)
    if args.json:
        _line(TaskList(tasks=tasks).model_dump_json())
        return Exit.OK
    on_terminal = out.is_terminal
    for line in _list_lines(tasks, out.width if on_terminal else None, header=on_terminal):
        _line(line)
    if not tasks and err.is_terminal:
        err.print("no tasks" + (f" {args.status}" if args.status else ""))
    elif len(tasks) == args.limit and err.is_terminal:
        err.print(f"more after these: --offset {args.offset + args.limit}", highlight=False)
    return Exit.OK


LIST_HEADER = ("ID", "STATUS", "CREATED (UTC)", "SIZE", "MODEL", "PROMPT")


def _list_lines(tasks: list[TaskView], width: int | None, header: bool = False) -> list[str]:
    """Columns id, status, created, size, model ("-": the fleet serves one), prompt. With a `width` (a
    terminal) the prompt is cut to fit; without (piped) it is whole, for grep and awk. Each field but
    the prompt is one word."""
    rows = [(t.id, t.status, _when(t.created_at), _size_of(t), t.model or "-", _prompt_of(t)) for t in tasks]
    if header and rows:
        rows.insert(0, LIST_HEADER)
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(LIST_HEADER) - 1)]
    lines = []
    for *fixed, prompt in rows:
        head = "  ".join(f.ljust(w) for f, w in zip(fixed, widths)) + "  "
        lines.append(head + (prompt if width is None else _cut(prompt, width - len(head))))
    return lines


def _size_of(task: TaskView) -> str:
    """The image's size once made, else the one asked for; "-" for the worker's default."""
    if task.result:
        return f"{task.result.width}x{task.result.height}"
    w, h = task.input.get("width"), task.input.get("height")
    return f"{w}x{h}" if w and h else "-"


def _prompt_of(task: TaskView) -> str:
    return _one_line(str(task.input.get("prompt", "")))


def _one_line(text: str) -> str:
    """A prompt as one line of printable text: newlines, tabs and escape codes become spaces."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _cut(text: str, room: int) -> str:
    cut = Text(text)
    cut.truncate(max(room, 10), overflow="ellipsis")  # in terminal cells: wide characters count twice
    return cut.plain


def status(dit: Client, args) -> int:
    """One "key value" line each, never cut: ids, paths and URLs are copied from here, piped or not."""
    try:
        task = dit.wait(args.id, timeout_s=args.wait_s) if args.wait_s > 0 else dit.get(args.id)
    except TaskNotEnded as e:
        task = e.task  # shown as it stands; the exit status says the wait ran out
    rows = [("id", task.id), ("status", task.status), ("model", task.model), ("size", _size_of(task)),
            ("prompt", _prompt_of(task)), ("attempts", f"{task.attempts}/{task.max_attempts}"),
            ("worker_id", task.worker_id)]
    rows += [(key, _when(getattr(task, key))) for key in ("created_at", "started_at", "finished_at", "expires_at")]
    if task.result:
        rows.append(("result", task.result.url or task.result.uri))
    if task.error:
        rows.append(("error", f"{task.error.code}: {task.error.message}"))
    for key, value in rows:
        _line(f"{key:<12}{'-' if value is None else value}")
    if task.status in ("failed", "cancelled"):
        return Exit.TASK_FAILED
    return Exit.NOT_ENDED if args.wait_s > 0 and task.status not in FINAL_STATUSES else Exit.OK


def _when(epoch: float | None) -> str | None:
    """UTC, to the second, as ISO 8601: what people and log search read."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cancel(dit: Client, args) -> int:
    task = dit.cancel(args.id)
    if task.status == "cancelled":
        _line(f"{task.id} cancelled")
    else:
        _line(f"{task.id} marked for cancellation ({task.status}); it ends cancelled once its worker hears")
    return Exit.OK


# ---------------------------------------------------------------- watch


def watch(dit: Client, args) -> int:
    shown = 1
    with Live(_dashboard(dit), console=out, refresh_per_second=4) as live:
        while args.count is None or shown < args.count:
            time.sleep(args.interval)
            live.update(_dashboard(dit))
            shown += 1
    return Exit.OK


def _dashboard(dit: Client) -> Table:
    q = dit.queue()
    grid = Table.grid(padding=(0, 2))
    depth = ", ".join(f"p{p}: {n}" for p, n in sorted(q.queued_by_priority.items(), key=lambda kv: -int(kv[0])))
    oldest = f"{q.oldest_queued_age_s:.0f}s" if q.oldest_queued_age_s is not None else "-"
    ended = q.ended_last_s.get("60", {})
    grid.add_row(f"[bold]queued[/] {q.queued} ({depth or 'empty'})", f"[bold]oldest[/] {oldest}",
                 f"[bold]running[/] {q.running}",
                 f"[bold]last minute[/] [green]{ended.get('succeeded', 0)} succeeded[/], "
                 f"[red]{ended.get('failed', 0)} failed[/]")
    workers = Table(title="workers", expand=False)
    for col in ("worker", "host", "status", "devices", "in flight", "images", "heartbeat"):
        workers.add_column(col)
    for w in dit.workers():
        if w.status == RegistrationStatus.REPLACED:
            continue
        colour = WORKER_COLOUR.get(w.status, "yellow")
        age = f"{w.last_heartbeat_age_s:.0f}s ago" if w.last_heartbeat_age_s is not None else "never"
        workers.add_row(w.id, w.hostname, f"[{colour}]{w.status}[/]", str(len(w.devices)), str(len(w.in_flight)),
                        str(w.counters.get("images_generated", 0)), age)
    outer = Table.grid()
    outer.add_row(grid)
    outer.add_row(workers)
    return outer


def models(dit: Client, args) -> int:
    """The fleet's models, one line each: the autoscaling signal per model."""
    view = dit.models()
    if args.json:
        _line(view.model_dump_json())
        return Exit.OK
    if not view.models:
        _line("this fleet serves one model and does not route by model (the scheduler's models.ids is empty)")
        return Exit.OK
    _line(f"{'MODEL':<24} {'QUEUED':>7} {'OLDEST':>8} {'RUNNING':>8} {'WARM':>5} {'LOADABLE':>9}")
    for name, m in view.models.items():
        oldest = "-" if m.oldest_queued_age_s is None else f"{m.oldest_queued_age_s:.1f}s"
        mark = " (default)" if name == view.default else ""
        _line(f"{_cut(name, 24):<24} {m.queued:>7} {oldest:>8} {m.running:>8} {m.warm_workers:>5} "
              f"{m.loadable_workers:>9}{mark}")
    return Exit.OK


COMMANDS = {"submit": submit, "list": list_tasks, "status": status, "download": download, "cancel": cancel,
            "watch": watch, "models": models}


# ---------------------------------------------------------------- arguments


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 1360x768") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be positive, e.g. 1360x768")
    return w, h


def _values_joined(argv: list[str]) -> list[str]:
    """`--size -16x512` as `--size=-16x512`: argparse takes a value that starts with "-" for an option
    and says only "expected one argument"; joined, the value itself is judged (and refused by name)."""
    out, rest = [], iter(argv)
    for arg in rest:
        value = next(rest, None) if arg == "--size" else None
        out.append(arg if value is None else f"--size={value}")
    return out


def _url(text: str) -> str:
    try:
        return scheduler_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _exit_help() -> str:
    return "exit status:\n" + "\n".join(f"  {int(code):<5}{meaning}" for code, meaning in EXIT_MEANINGS.items())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dit", description=__doc__, epilog=_exit_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", type=_url, default=os.environ.get("DIT_URL", "http://127.0.0.1:8700"),
                   help="the scheduler (DIT_URL); host:port means http://host:port")
    p.add_argument("--token", default=os.environ.get("DIT_TOKEN"), help="a client token (DIT_TOKEN)")
    p.add_argument("--retry-deadline", type=float, default=60.0, help="seconds to keep retrying an unavailable scheduler")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", help="queue a prompt; --wait for the image")
    s.add_argument("prompt")
    s.add_argument("--size", type=_size, help="WIDTHxHEIGHT (default: the worker's)")
    s.add_argument("--steps", type=int)
    s.add_argument("--seed", type=int)
    s.add_argument("--format", choices=("png", "webp", "jpeg"))
    s.add_argument("--images", type=int, help="how many images (seeds SEED, SEED+1, ...; default 1)")
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--model", help="one of the fleet's models (`dit models`); default: the fleet's default")
    s.add_argument("--wait", action="store_true", help="wait for the task to end, showing its progress on a terminal")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600; then exit 124)")
    s.add_argument("-o", "--output", help="download the image here (waits, as --wait does)")
    ls = sub.add_parser("list", help="tasks, one line each, oldest first")
    ls.add_argument("--status", choices=get_args(TaskStatus))
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100, up to 1000)")
    ls.add_argument("--offset", type=int, default=0, help="skip this many first (paging)")
    ls.add_argument("--json", action="store_true", help='GET /v1/tasks\'s answer, {"tasks": [...]}, for scripts')
    st = sub.add_parser("status", help="a task's state")
    st.add_argument("id")
    st.add_argument("--wait-s", type=float, default=0.0,
                    help="wait up to this long for it to end first (then exit 124)")
    d = sub.add_parser("download", help="a task's image, by id")
    d.add_argument("id")
    d.add_argument("-o", "--output", help="the file (default: ID.png, or the task's format, here)")
    d.add_argument("--wait", action="store_true", help="wait for the task to end first")
    d.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600; then exit 124)")
    c = sub.add_parser("cancel", help="cancel a task")
    c.add_argument("id")
    w = sub.add_parser("watch", help="a live table of the queue and the workers")
    w.add_argument("--interval", type=float, default=2.0)
    w.add_argument("--count", type=int, help="stop after this many refreshes")
    m = sub.add_parser("models", help="the fleet's models: each one's queue and workers")
    m.add_argument("--json", action="store_true", help="GET /v1/models's answer, for scripts")
    return p


if __name__ == "__main__":
    sys.exit(main())
