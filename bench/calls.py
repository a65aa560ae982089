"""`make bench-calls`: what each of the calls a task costs (submit, lease, `processing`, `succeeded`,
a heartbeat, and the exchange that replaces lease and reports) takes of the scheduler's CPU, one call at a time, so the figure is the call's own
and not its share of a group commit under load. A scheduler process saturated by a fleet of
single-GPU workers is bound by this sum (docs/queue.md).

    python -m bench calls [--calls 200] [--blocks 20] [--store postgres] [--durable]
                              [--set k=v] [--against-set api.hot_path=false | --against-tree ../other]

Starts the reference scheduler (SQLite on tmpfs unless --durable, so an fsync's wait is left out and
the figure is CPU; or PostgreSQL, a real server, fsync off unless --durable), registers one worker
and, in each block, makes `--calls` calls of each kind in turn from one keep-alive connection:
submits of one task, leases of one task each (wait_s 0), a `processing` and a `succeeded` report per
task, heartbeats; then exchanges, each claiming one task and carrying the previous one's
`processing` note and `succeeded` report. A call's cost is the scheduler process's CPU time (all its threads; the database
server's own is not counted) over the calls of that kind, divided by their number; the figure
printed is the median over the blocks. `a task` is submit + lease + processing + succeeded: the
scheduler's CPU for one single-GPU task, so 1,000 ms over it is the tasks/s one process carries on
a core of this machine; `a task by the exchange` is submit + exchange.

With --against-set or --against-tree a second scheduler runs beside the first, the two taking turns
block by block (in an order that alternates), and the ratio of each block's pair is printed, their
median: a ratio measured side by side, which the machine's drift from minute to minute does not
move as it moves two runs made apart.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from launch.local import free_port, start_scheduler
from bench.servers import Postgres
from bench.fleet import REG, RESULT
from bench.reports import save

KINDS = ("submit", "lease", "processing", "succeeded", "heartbeat", "exchange")
TASK = ("submit", "lease", "processing", "succeeded")
# A task through the exchange: its submit, and the one exchange that claims it and carries the previous
# task's `processing` note and result (a single-GPU worker's steady state).
EXCHANGE_TASK = ("submit", "exchange")


class Calls:
    """One worker's and one client's calls on one connection; the leases taken are kept for the reports."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.wid = self._ok(http.post("/v1/workers", json=REG))["worker_id"]
        self.leases: list[dict] = []
        self.previous: dict | None = None  # the exchange's last claim, reported by the next one

    @staticmethod
    def _ok(r: httpx.Response) -> dict:
        if r.status_code not in (200, 201):
            raise SystemExit(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def submit(self, i: int) -> None:
        self._ok(self.http.post("/v1/tasks", json={"input": {"prompt": f"call cost {i}"}}))

    def lease(self, _i: int) -> None:
        got = self._ok(self.http.post(f"/v1/workers/{self.wid}/lease", json={"max_tasks": 1, "wait_s": 0}))["leases"]
        if len(got) != 1:
            raise SystemExit(f"a lease returned {len(got)} tasks, not 1: the queue ran short")
        self.leases.append(got[0])

    def _report(self, i: int, status: str, **extra) -> None:
        le = self.leases[i]
        self._ok(self.http.post(f"/v1/tasks/{le['task_id']}/report", json={
            "worker_id": self.wid, "lease_token": le["lease_token"], "status": status, **extra}))

    def processing(self, i: int) -> None:
        self._report(i, "processing")

    def succeeded(self, i: int) -> None:
        self._report(i, "succeeded", result=RESULT)

    def heartbeat(self, _i: int) -> None:
        self._ok(self.http.post(f"/v1/workers/{self.wid}/heartbeat",
                                json={"status": "ready", "in_flight": [], "timestamp": time.time()}))

    def queue(self, n: int) -> None:
        """Tasks for the exchanges to claim (not measured)."""
        for i in range(n):
            self.submit(i)

    def exchange(self, i: int, claim: bool = True) -> None:
        """The previous claim's start and result, and a claim of the next."""
        reports = []
        if (le := self.previous) is not None:
            mine = {"task_id": le["task_id"], "worker_id": self.wid, "lease_token": le["lease_token"]}
            reports = [{**mine, "status": "processing", "at": time.time()},
                       {**mine, "status": "succeeded", "result": RESULT}]
        got = self._ok(self.http.post(f"/v1/workers/{self.wid}/exchange", json={
            "exchange_id": f"x-{i}-{time.monotonic_ns()}", "reports": reports, "max_tasks": int(claim)}))
        if any(r["status_code"] != 200 for r in got["results"]):
            raise SystemExit(f"an exchange's report was refused: {got['results']}")
        if claim and len(got["leases"]) != 1:
            raise SystemExit(f"an exchange claimed {len(got['leases'])} tasks, not 1: the queue ran short")
        self.previous = got["leases"][0] if claim else None


def cpu_s(proc: psutil.Process) -> float:
    """The process's CPU seconds, all its threads: from the kernel's accounting in
    nanoseconds where Linux gives it (/proc/PID/task/*/schedstat), else psutil's clock ticks."""
    tasks = Path(f"/proc/{proc.pid}/task")
    if tasks.is_dir():
        total = 0
        for t in tasks.iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                total += int((t / "schedstat").read_text().split()[0])
        return total / 1e9
    t = proc.cpu_times()
    return t.user + t.system


def measure(proc: psutil.Process, call: Callable[[int], None], n: int) -> float:
    """The scheduler's CPU microseconds per call over n calls."""
    cpu0 = cpu_s(proc)
    for i in range(n):
        call(i)
    return (cpu_s(proc) - cpu0) / n * 1e6


def run(servers: dict[str, tuple[str, psutil.Process]], calls: int, blocks: int) -> dict[str, dict[str, list[float]]]:
    """Each server's CPU per call, per kind and block. In a block each server in turn (in an order
    that alternates from block to block, so a drift in the machine's speed falls on both) submits
    `calls` tasks, leases them, reports them and heartbeats, so its worker holds nothing at its
    heartbeats. Block -1 warms up (connection, caches, the first statements) and is not kept."""
    out: dict[str, dict[str, list[float]]] = {name: {k: [] for k in KINDS} for name in servers}
    with contextlib.ExitStack() as stack:
        clients = {name: Calls(stack.enter_context(httpx.Client(base_url=url, timeout=30.0)))
                   for name, (url, _) in servers.items()}
        for b in range(-1, blocks):
            for name in (list(servers) if b % 2 else list(reversed(servers))):
                clients[name].leases.clear()
                for kind in KINDS:
                    if kind == "exchange":
                        clients[name].queue(calls)
                    us = measure(servers[name][1], getattr(clients[name], kind), calls)
                    if b >= 0:
                        out[name][kind].append(round(us, 1))
                clients[name].exchange(calls, claim=False)  # the last claim's result: the queue left empty
    return out


def summary(per_kind: dict[str, list[float]]) -> dict[str, float]:
    """Each kind's median over the blocks, and a task's (the sum of its calls, block by block),
    by separate calls and by the exchange."""
    blocks = range(len(per_kind["submit"]))
    return {**{k: statistics.median(v) for k, v in per_kind.items()},
            "task": statistics.median(sum(per_kind[k][b] for k in TASK) for b in blocks),
            "task_exchange": statistics.median(sum(per_kind[k][b] for k in EXCHANGE_TASK) for b in blocks)}


def show(name: str, per_kind: dict[str, list[float]]) -> None:
    fig = summary(per_kind)
    print(f"{name}:")
    for k in KINDS:
        v = per_kind[k]
        print(f"  {k:11s} {fig[k]:7.0f} us of scheduler CPU per call (median of {len(v)} blocks; "
              f"{min(v):.0f}-{max(v):.0f})")
    print(f"  a task     {fig['task']:7.0f} us (submit + lease + processing + succeeded): "
          f"{1e6 / fig['task']:.0f} tasks/s on one core of this machine")
    print(f"  a task     {fig['task_exchange']:7.0f} us by the exchange (submit + exchange): "
          f"{1e6 / fig['task_exchange']:.0f} tasks/s on one core of this machine")


def ratios(this: dict[str, list[float]], against: dict[str, list[float]]) -> dict[str, float]:
    """this / against per kind and per task: the median of the ratios of blocks run side by side."""
    out = {k: statistics.median(a / b for a, b in zip(this[k], against[k])) for k in KINDS}
    blocks = range(len(this["submit"]))
    task = [sum(this[k][i] for k in TASK) / sum(against[k][i] for k in TASK) for i in blocks]
    ex = [sum(this[k][i] for k in EXCHANGE_TASK) / sum(against[k][i] for k in EXCHANGE_TASK) for i in blocks]
    return {**out, "task": statistics.median(task), "task_exchange": statistics.median(ex)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench calls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200, help="calls of each kind per block")
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                   help="postgres: a PostgreSQL server started for the run, each scheduler on a database of its own")
    p.add_argument("--durable", action="store_true",
                   help="SQLite on the temporary folder's disk, not tmpfs; PostgreSQL with fsync on")
    p.add_argument("--set", action="append", default=[], help="a scheduler setting (--set k=v)")
    p.add_argument("--against-set", action="append", default=[],
                   help="a second scheduler, measured in the same blocks, with this setting too (k=v)")
    p.add_argument("--against-tree", type=Path,
                   help="a second scheduler, measured in the same blocks, run from this checkout (a git worktree)")
    p.add_argument("--out", type=Path, default=Path("var/bench/calls.json"))
    args = p.parse_args(argv)
    shm = Path("/dev/shm")
    base = None if args.durable or not shm.is_dir() else shm
    wanted = {"this": (args.set, None)}
    if args.against_set or args.against_tree:
        wanted["against"] = (args.set + args.against_set, args.against_tree)
    with tempfile.TemporaryDirectory(dir=base) as tmp, contextlib.ExitStack() as stack:
        pg = None
        if args.store == "postgres":
            pg = Postgres(Path(tmp), durable=args.durable)
            stack.callback(pg.stop)
        servers = {}
        for name, (sets, tree) in wanted.items():
            port = free_port()
            sched = start_scheduler(pg.fresh() if pg else Path(tmp) / f"{name}.db", port, Path(tmp) / f"{name}.log", lease_ttl=600.0,
                                    extra=["--logging-level", "WARNING", *[a for kv in sets for a in ("--set", kv)]],
                                    **({"cwd": tree.resolve()} if tree else {}))
            stack.callback(sched.stop)
            servers[name] = (f"http://127.0.0.1:{port}", psutil.Process(sched.pid))
        figures = run(servers, args.calls, args.blocks)
    show("this", figures["this"])
    report = {"machine": platform.processor() or platform.machine(), "cores": psutil.cpu_count(),
              "calls_per_block": args.calls, "blocks": args.blocks, "store": args.store, "durable": args.durable, "set": args.set,
              "python": sys.version.split()[0], "this": summary(figures["this"]), "blocks_us": figures}
    if "against" in figures:
        show(f"against ({' '.join(args.against_set + [str(args.against_tree or '')]).strip()})", figures["against"])
        r = ratios(figures["this"], figures["against"])
        print("this / against (median of the blocks' ratios): " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
        report.update(against=summary(figures["against"]), against_set=args.against_set,
                      against_tree=str(args.against_tree or ""), ratios=r)
    save(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
