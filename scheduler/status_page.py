"""The status page (GET /status): workers, queue depth, the last hour's throughput and latency as
small inline SVG charts, recent results with thumbnails, recent failures. Rendered on the server
(Jinja2, autoescaped); its only script refreshes it in place. Nothing is fetched from elsewhere:
the page works on a network without internet.

Thumbnails of local results come from GET /status/thumbs/{task_id}.png, only for files under the
roots the operator named (--results-root): the page never reads a path just because a task names
it. A result with a signed URL is shown from that URL.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from PIL import Image

from protocol import QueueFigures, TaskView, WorkerView
from scheduler.results import local_path
from scheduler.store import Store, Unknown
from scheduler.store.lifecycle import CLOSED, R

HOUR_S = 3600
BUCKET_S = 60
RECENT = 12
THUMB_PX = 160

_env = Environment(loader=PackageLoader("scheduler", "templates"), autoescape=select_autoescape(["html"]))


@dataclass
class Chart:
    """Bars (tasks ended per minute: succeeded, failed) and a line (mean seconds from submission
    to end), as SVG coordinates in a 600 x 80 box."""

    bars: list[tuple[float, float, float, float]]  # x, width, succeeded height, failed height
    line: str  # polyline points of the mean latency
    dots: list[tuple[float, float]]  # the same points, drawn (a single minute makes no line)
    peak_per_min: int
    peak_latency_s: float
    total_succeeded: int
    total_failed: int
    mean_latency_s: float | None


def build_chart(rows: list[dict], buckets: int = HOUR_S // BUCKET_S, width: float = 600, height: float = 80) -> Chart:
    ok, bad, mean = [0] * buckets, [0] * buckets, [None] * buckets
    weighted = [0.0] * buckets
    for r in rows:
        b = min(max(int(r["bucket"]), 0), buckets - 1)
        if r["status"] == "succeeded":
            ok[b] += r["n"]
            weighted[b] += r["mean_s"] * r["n"]
        elif r["status"] == "failed":
            bad[b] += r["n"]
    for b in range(buckets):
        mean[b] = weighted[b] / ok[b] if ok[b] else None
    peak = max(max(o + f for o, f in zip(ok, bad)), 1)
    peak_lat = max((m for m in mean if m is not None), default=0.0) or 1.0
    step = width / buckets
    bars = [(b * step, step * 0.8, height * ok[b] / peak, height * bad[b] / peak) for b in range(buckets)]
    dots = [(round(b * step + step * 0.4, 1), round(height - (height - 4) * m / peak_lat, 1))
            for b, m in enumerate(mean) if m is not None]
    done = sum(ok)
    return Chart(bars, " ".join(f"{x},{y}" for x, y in dots), dots, peak, round(peak_lat, 2), done, sum(bad),
                 round(sum(weighted) / done, 2) if done else None)


@dataclass
class Page:
    now: float
    figures: QueueFigures
    workers: list[WorkerView]
    superseded: int  # ended registrations of workers that registered again since (not listed)
    chart: Chart
    results: list[TaskView]
    failures: list[TaskView]


def gather(store: Store) -> Page:
    """Everything the page shows, read from the database (call it off the event loop)."""
    workers, superseded = current(store.workers.workers())
    return Page(now=time.time(), figures=store.tasks.figures(), workers=workers, superseded=superseded,
                chart=build_chart(store.tasks.history(HOUR_S, BUCKET_S)),
                results=store.tasks.recent("succeeded", HOUR_S, RECENT),
                failures=store.tasks.recent("failed", HOUR_S, 20))


def current(workers: list[WorkerView]) -> tuple[list[WorkerView], int]:
    """The registrations worth a row, and how many were left out: a replaced one never (its node's
    new one is listed), and a drained or lost one only until the same worker (its host and ops
    address) registers again, so a node restarted five times is one row, not six."""
    newest: dict[tuple, float] = {}
    for w in workers:
        key = (w.hostname, w.ops_url)
        newest[key] = max(newest.get(key, 0.0), w.registered_at)
    shown = [w for w in workers if w.status not in CLOSED
             or (w.status != R.REPLACED and w.registered_at >= newest[(w.hostname, w.ops_url)])]
    return shown, sum(1 for w in workers if w.status in (R.DRAINED, R.LOST)) - sum(1 for w in shown if w.status in CLOSED)


# A worker's status colour: ready green, lost red, a registration closed on purpose (drained,
# replaced) neutral, the rest (initializing, draining) amber.
STATUS_CLASS = {R.READY: "ok", R.LOST: "bad", R.DRAINED: "muted", R.REPLACED: "muted"}
IN_FLIGHT_HELP = ("tasks it holds (leased, waiting for a round, generating, or generated and not yet reported) / "
                  "the most it may hold: lease_ahead waiting plus max_pending generating or unreported")


def render(page: Page) -> str:
    return _env.get_template("status.html").render(p=page, thumb=thumb_src, ago=_ago, prompt=_prompt,
                                                   device_summary=_devices, in_flight=in_flight,
                                                   in_flight_help=IN_FLIGHT_HELP, status_class=STATUS_CLASS)


def in_flight(w: WorkerView) -> str:
    """The tasks a worker holds, and the most it may hold. The heartbeat lists every task leased
    and not yet reported: those admitted and waiting for a round (at most `lease_ahead`) and those
    generating or in the post stage (at most `max_pending`), so the bound is their sum, not
    `lease_ahead` alone."""
    held = len(w.in_flight)
    ahead, pending = w.counters.get("lease_ahead"), w.counters.get("max_pending")
    return f"{held} / {ahead + pending}" if ahead and pending else str(held)


def thumb_src(task: TaskView) -> str | None:
    """Where the page loads a result's thumbnail from: the signed URL, or this scheduler for a
    local file; None for results it cannot show (gs:// without a signed URL)."""
    if task.result is None:
        return None
    if task.result.url and task.result.url.startswith("https://"):
        return task.result.url
    if task.result.uri.startswith("file://"):
        return f"/status/thumbs/{task.id}.png"
    return None


def thumbnail(store: Store, roots: tuple[Path, ...], task_id: str) -> bytes:
    """A small PNG of a succeeded task's local result. Unknown unless the file lies under one of
    `roots` (resolved, so ../ and symlinks cannot leave them) and opens as an image."""
    task = store.tasks.get(task_id)
    if task.status != "succeeded" or task.result is None or not task.result.uri.startswith("file://"):
        raise Unknown(f"task {task_id} has no local result")
    if (path := local_path(task.result.uri, roots)) is None:
        raise Unknown(f"task {task_id}'s result is outside the results roots (--results-root)")
    try:
        with Image.open(path) as img:
            img.thumbnail((THUMB_PX, THUMB_PX))
            out = io.BytesIO()
            img.convert("RGB").save(out, "PNG", optimize=False)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise Unknown(f"task {task_id}'s result cannot be read: {e}") from e
    return out.getvalue()


def _ago(now: float, then: float | None) -> str:
    if then is None:
        return "never"
    s = max(0.0, now - then)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.0f}h ago"


def _prompt(task: TaskView, limit: int = 80) -> str:
    text = str(task.input.get("prompt", "")) if isinstance(task.input, dict) else ""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _devices(w: WorkerView) -> str:
    names = sorted({d.name for d in w.devices})
    return f"{len(w.devices)} \u00d7 {', '.join(names)}" if names else f"{w.world_size} rank(s)"
