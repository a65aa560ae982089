"""`dit`: the queue from a terminal.

    dit submit "a lighthouse at dawn" --size 1360x768 --wait -o out.png
    dit status ID            dit cancel ID            dit watch

The scheduler's address and the client token come from --url / --token or DIT_URL / DIT_TOKEN.
Exit status: 0 done; 1 the task failed or was cancelled; 2 a usage error or a refused request;
3 the scheduler unreachable or the token refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone

from rich.console import Console
from rich.live import Live
from rich.table import Table

from client.api import Client, scheduler_url
from client.errors import AuthError, ClientError, Conflict, InvalidRequest, TaskFailed, TaskNotFound, Unavailable
from protocol import TaskView

err = Console(stderr=True, soft_wrap=True)  # messages stay whole lines, to copy and grep
out = Console()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with Client(args.url, args.token, retry_deadline_s=args.retry_deadline) as dit:
            return COMMANDS[args.command](dit, args)
    except (AuthError, Unavailable) as e:
        err.print(f"[red]error:[/] {e}")
        return 3
    except (InvalidRequest, Conflict, TaskNotFound) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    except TaskFailed as e:
        err.print(f"[red]{e}[/]")
        return 1
    except ClientError as e:
        err.print(f"[red]error:[/] {e}")
        return 1
    except KeyboardInterrupt:
        return 130


def submit(dit: Client, args) -> int:
    width, height = args.size or (None, None)
    task = dit.submit(args.prompt, width=width, height=height, steps=args.steps, seed=args.seed,
                      output_format=args.format, priority=args.priority)
    if not (args.wait or args.output):  # a file asked for is a result waited for
        out.print(task.id)
        return 0
    with err.status(f"{task.id}: {task.status}") as spinner:
        t0 = time.monotonic()

        def update(t: TaskView) -> None:
            spinner.update(f"{t.id}: {t.status} ({time.monotonic() - t0:.0f}s)")

        task = dit.wait(task.id, timeout_s=args.timeout, on_update=update)
    if task.status != "succeeded":
        raise TaskFailed(task)
    r = task.result
    err.print(f"[green]{task.id} succeeded[/] in {task.finished_at - task.created_at:.1f}s: "
              f"{r.width}x{r.height}, seed {r.seed}")
    if args.output:
        out.print(str(dit.download(task, args.output)))
    else:
        out.print(r.url or r.uri)
    return 0


def status(dit: Client, args) -> int:
    """One "key value" line each, never cut: ids, paths and URLs are copied from here, piped or not."""
    task = dit.get(args.id, wait_s=args.wait_s)
    rows = [("id", task.id), ("status", task.status), ("attempts", task.attempts), ("worker_id", task.worker_id)]
    rows += [(key, _when(getattr(task, key))) for key in ("created_at", "started_at", "finished_at", "expires_at")]
    if task.result:
        rows.append(("result", task.result.url or task.result.uri))
    if task.error:
        rows.append(("error", f"{task.error.code}: {task.error.message}"))
    for key, value in rows:
        out.print(f"{key:<12}{'-' if value is None else value}", markup=False, highlight=False, soft_wrap=True)
    return 1 if task.status in ("failed", "cancelled") else 0


def _when(epoch: float | None) -> str | None:
    """UTC, to the second, as ISO 8601: what people and log search read."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cancel(dit: Client, args) -> int:
    task = dit.cancel(args.id)
    if task.status == "cancelled":
        out.print(f"{task.id} cancelled")
    else:
        out.print(f"{task.id} marked for cancellation ({task.status}); it ends cancelled once its worker hears")
    return 0


def watch(dit: Client, args) -> int:
    shown = 1
    with Live(_dashboard(dit), console=out, refresh_per_second=4) as live:
        while args.count is None or shown < args.count:
            time.sleep(args.interval)
            live.update(_dashboard(dit))
            shown += 1
    return 0


def _dashboard(dit: Client) -> Table:
    q = dit.queue()
    grid = Table.grid(padding=(0, 2))
    depth = ", ".join(f"p{p}: {n}" for p, n in sorted(q.queued_by_priority.items(), key=lambda kv: -int(kv[0])))
    oldest = f"{q.oldest_queued_age_s:.0f}s" if q.oldest_queued_age_s is not None else "-"
    ended = q.ended_last_s.get("60", {})
    grid.add_row(f"[bold]queued[/] {q.queued} ({depth or 'empty'})", f"[bold]oldest[/] {oldest}",
                 f"[bold]running[/] {q.running}",
                 f"[bold]last minute[/] [green]{ended.get('succeeded', 0)}[/] / [red]{ended.get('failed', 0)}[/]")
    workers = Table(title="workers", expand=False)
    for col in ("worker", "host", "status", "devices", "in flight", "images", "heartbeat"):
        workers.add_column(col)
    for w in dit.workers():
        if w.status == "replaced":
            continue
        colour = {"ready": "green", "lost": "red"}.get(w.status, "yellow")
        age = f"{w.last_heartbeat_age_s:.0f}s ago" if w.last_heartbeat_age_s is not None else "never"
        workers.add_row(w.id, w.hostname, f"[{colour}]{w.status}[/]", str(len(w.devices)), str(len(w.in_flight)),
                        str(w.counters.get("images_generated", 0)), age)
    outer = Table.grid()
    outer.add_row(grid)
    outer.add_row(workers)
    return outer


COMMANDS = {"submit": submit, "status": status, "cancel": cancel, "watch": watch}


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 1360x768") from None
    return w, h


def _url(text: str) -> str:
    try:
        return scheduler_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--wait", action="store_true", help="wait for the task to end, showing its progress")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")
    s.add_argument("-o", "--output", help="download the image here (waits, as --wait does)")
    st = sub.add_parser("status", help="a task's state")
    st.add_argument("id")
    st.add_argument("--wait-s", type=float, default=0.0, help="wait up to this long for it to end first")
    c = sub.add_parser("cancel", help="cancel a task")
    c.add_argument("id")
    w = sub.add_parser("watch", help="a live table of the queue and the workers")
    w.add_argument("--interval", type=float, default=2.0)
    w.add_argument("--count", type=int, help="stop after this many refreshes")
    return p


if __name__ == "__main__":
    sys.exit(main())
