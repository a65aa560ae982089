"""`python -m bench scheduler` (`make bench-scheduler`): the reference scheduler under N simulated workers
speaking the real protocol over loopback, for each backend side by side in one run: SQLite, and
PostgreSQL with one and with two scheduler processes (the workers split between them).

Every worker registers; then the tasks are submitted in batches of 1,000 (submits/s is measured on
its own); then the workers start, each somewhere within its first round, and loop as the worker
does: lease (up to --lease-max tasks, long poll), `processing` for the lease's tasks, --work-s per
task of simulated GPU time (+-20%, so workers do not fall into step), `succeeded` for them; with
--lease-max above 1 a lease's reports go in one POST /v1/reports call per status, as the worker
sends them; with 1, one call per report. Each also heartbeats every --heartbeat-s with its tasks.
Defaults: 500 workers, each a GPU node taking rounds of 8 tasks at 0.4 s per task (an H100 at
about 2.5 images/s), so the fleet could complete up to 1,250 tasks/s.

The simulated workers use aiohttp (see simulate). Figures come from the steady window (see Window):
lifecycles/s (lease -> processing -> succeeded), the latency of lease calls that returned work, and
the cores each process used. Prints a table and writes JSON to --out. PostgreSQL runs as a real
server started for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
import uvloop

from launch.local import free_port, start_scheduler
from bench.servers import Postgres
from bench.reports import save

REG = {"hostname": "bench", "world_size": 1, "devices": [{"name": "sim", "memory_bytes": 0}], "model": "sim",
       "version": "bench"}
RESULT = {"uri": "file:///bench.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 1,
          "bytes": 1, "sha256": "0"}


class Http:
    """One simulated worker's connection: POST JSON, get (status code, JSON body or None)."""

    def __init__(self, base_url: str) -> None:
        self._base = base_url
        self._session: aiohttp.ClientSession | None = None

    async def post(self, path: str, body: dict) -> tuple[int, dict | None]:
        if self._session is None:  # made on the running loop
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                                  timeout=aiohttp.ClientTimeout(total=60))
        async with self._session.post(self._base + path, json=body) as resp:
            return resp.status, (await resp.json() if resp.status in (200, 201) else None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class Window:
    """The steady part of a run: from the moment a tenth of the tasks are done (connections open,
    every worker in its loop) to the first lease that found the queue short, or nine tenths done.
    Figures come from this window only: neither the start burst nor the drain is what a fleet sees
    while work is queued. It also takes the CPU each process used within it."""

    def __init__(self, tasks: int, procs: dict[str, list[int]]) -> None:
        self.tasks, self.start, self.end, self.dry = tasks, None, None, None
        self.procs = {name: [psutil.Process(p) for p in pids] for name, pids in procs.items()}
        self.procs["bench client"] = [psutil.Process()]
        self.cpu0: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        out = {name: sum(sum(p.cpu_times()[:2]) for p in ps) for name, ps in self.procs.items()}
        t = psutil.cpu_times()
        out["machine"] = t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
        return out

    def completed(self, n: int, now: float) -> None:
        if self.start is None and n >= self.tasks // 10:
            self.start, self.cpu0 = now, self._cpu()
        elif self.start is not None and self.end is None and (n >= self.tasks * 9 // 10 or self.dry):
            self.end = now
            self.cpu = {k: v - self.cpu0[k] for k, v in self._cpu().items()}

    def queue_ran_dry(self, t: float) -> None:
        if self.dry is None:
            self.dry = t

    def figures(self, done_at: list[float], leases: list[tuple[float, float, int]]) -> dict:
        steady = self.start is not None and self.end is not None and self.end - self.start > 0
        lo, hi = self.start, self.end
        ms = sorted(m for t, m, n in leases if n and lo <= t <= hi) if steady else []
        if not ms:  # a run too short to have a steady part: the whole run, and said so
            steady, lo, hi = False, min(t for t, _, _ in leases), max(done_at)
            ms = sorted(m for t, m, n in leases if n)
        finished = sum(lo < t <= hi for t in done_at)
        seconds = hi - lo
        out = {"steady": steady, "window_s": round(seconds, 2), "lifecycles_per_s": round(finished / seconds, 1),
               "lease_p50_ms": round(statistics.median(ms), 2), "lease_p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2),
               "leases": len(ms)}
        if self.cpu and steady:
            cores = {k: v / seconds for k, v in self.cpu.items()}
            cores["others (database)"] = cores.pop("machine") - sum(cores.values())
            out["cores"] = {k: round(v, 2) for k, v in cores.items()}
        return out


async def simulate(urls: list[str], workers: int, tasks: int, lease_max: int, work_s: float = 0.0,
                   procs: dict[str, list[int]] | None = None, heartbeat_s: float = 30.0) -> dict:
    # A session (one connection) per simulated worker, as real workers have. aiohttp, not httpx (the
    # worker's client): the 500 workers share the scheduler's cores, and with httpx they took 0.45-0.5
    # cores against aiohttp's 0.17-0.24 at the same rate; that contention, the simulation's cost and
    # not the scheduler's, was most of PostgreSQL's lease p99 (27-138 ms with httpx, 11-17 with aiohttp).
    clients = [Http(urls[n % len(urls)]) for n in range(workers)]
    leases: list[tuple[float, float, int]] = []  # (sent at, milliseconds, tasks got)
    done_at: list[float] = []
    go, done = asyncio.Event(), asyncio.Event()
    window = Window(tasks, procs or {})
    beats = [0, 0]  # heartbeats refused, answered

    async def worker(http: Http, wid: str) -> None:
        await go.wait()
        await asyncio.sleep(random.uniform(0, work_s * lease_max))  # nodes are not in step
        held: list[str] = []
        beating = asyncio.create_task(heartbeat(http, wid, held))
        try:
            while not done.is_set():
                t = time.perf_counter()
                code, body = await http.post(f"/v1/workers/{wid}/lease", {"max_tasks": lease_max, "wait_s": 10.0})
                got = body["leases"] if code == 200 else []
                held[:] = [le["task_id"] for le in got]
                leases.append((t, (time.perf_counter() - t) * 1e3, len(got)))
                if len(got) < lease_max:
                    window.queue_ran_dry(t)
                for _ in range(await report(http, wid, got)):
                    done_at.append(time.perf_counter())
                    window.completed(len(done_at), done_at[-1])
                if len(done_at) >= tasks:
                    done.set()
        finally:
            beating.cancel()

    async def heartbeat(http: Http, wid: str, held: list[str]) -> None:
        """Every heartbeat_s, as the worker does (queue.heartbeat_interval_s), starting anywhere in it."""
        await asyncio.sleep(random.uniform(0, heartbeat_s))
        while True:
            code, _ = await http.post(f"/v1/workers/{wid}/heartbeat", {
                "status": "ready", "in_flight": list(held), "timestamp": time.time()})
            beats[code == 200] += 1
            await asyncio.sleep(heartbeat_s)

    async def report(http: Http, wid: str, got: list[dict]) -> int:
        if not got:
            return 0
        if lease_max == 1:  # one call per report
            ok = 0
            for le in got:
                body = {"worker_id": wid, "lease_token": le["lease_token"]}
                await http.post(f"/v1/tasks/{le['task_id']}/report", {**body, "status": "processing"})
                await asyncio.sleep(work_s)
                code, _ = await http.post(f"/v1/tasks/{le['task_id']}/report",
                                          {**body, "status": "succeeded", "result": RESULT})
                ok += code == 200
            return ok
        for status, extra in (("processing", {}), ("succeeded", {"result": RESULT})):
            if status == "succeeded" and work_s:
                await asyncio.sleep(work_s * len(got) * random.uniform(0.8, 1.2))
            _, answer = await http.post("/v1/reports", {"reports": [
                {"task_id": le["task_id"], "worker_id": wid, "lease_token": le["lease_token"], "status": status,
                 **extra} for le in got]})
        return sum(r["status_code"] == 200 for r in answer["results"])

    ids = await asyncio.gather(*[c.post("/v1/workers", REG) for c in clients])
    runners = [asyncio.create_task(worker(c, body["worker_id"])) for c, (_, body) in zip(clients, ids)]
    # Hundreds of clients in one process: a full collection of their objects stalls every simulated
    # worker at once (200 ms, seen as a latency spike no real worker would see). Collected after.
    gc.disable()
    t_submit = time.perf_counter()
    for start in range(0, tasks, 1000):
        batch = [{"input": {"prompt": f"bench {i}"}} for i in range(start, min(tasks, start + 1000))]
        code, answer = await clients[0].post("/v1/tasks/batch", {"tasks": batch})
        if code != 201:
            raise RuntimeError(f"POST /v1/tasks/batch: {code} {answer}")
    submit_s = time.perf_counter() - t_submit
    go.set()
    await asyncio.wait_for(done.wait(), timeout=900)
    for r in runners:
        r.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    for c in clients:
        await c.close()
    gc.enable()
    return {"tasks": tasks, "submits_per_s": round(tasks / submit_s, 1), **window.figures(done_at, leases),
            "heartbeats": beats[1], "heartbeats_refused": beats[0]}


def run_backend(name: str, args, work: Path, pg: Postgres | None) -> dict:
    db = str(work / f"{name}.db") if name == "sqlite" else pg.fresh()
    procs, urls = [], []
    for i in range(2 if name == "postgres-2" else 1):
        port = free_port()
        procs.append(start_scheduler(db, port, work / f"{name}-{i}.log", lease_ttl=60.0,
                                     extra=["--api-gate-max-queued", str(args.tasks + 1), "--logging-level", "WARNING"]))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        # uvloop: the simulated workers' own event loop adds less to the latencies measured.
        return uvloop.run(simulate(urls, args.workers, args.tasks, args.lease_max, args.work_s,
                                   {"scheduler": [p.pid for p in procs]}, args.heartbeat_s))
    finally:
        for p in procs:
            p.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench scheduler", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=500)
    p.add_argument("--tasks", type=int, default=30_000)
    p.add_argument("--lease-max", type=int, default=8, help="max_tasks per lease call (a round of a node)")
    p.add_argument("--backends", default="sqlite,postgres,postgres-2")
    p.add_argument("--work-s", type=float, default=0.4, help="simulated GPU time per task; 0: none")
    p.add_argument("--heartbeat-s", type=float, default=30.0, help="the workers' heartbeat interval")
    p.add_argument("--out", type=Path, default=Path("var/bench/scheduler.json"))
    args = p.parse_args(argv)
    backends = args.backends.split(",")
    report = {"machine": platform.processor() or platform.machine(), "workers": args.workers, "tasks": args.tasks,
              "lease_max": args.lease_max, "work_s": args.work_s,
              "heartbeat_s": args.heartbeat_s, "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pg = Postgres(work) if any(b.startswith("postgres") for b in backends) else None
        try:
            for name in backends:
                report["backends"][name] = row = run_backend(name, args, work, pg)
                print(f"{name:12s} {row['lifecycles_per_s']:8.1f} lifecycles/s  lease p50 {row['lease_p50_ms']:7.1f} ms"
                      f"  p99 {row['lease_p99_ms']:7.1f} ms  submits {row['submits_per_s']:7.1f}/s"
                      f"  ({row['tasks']} tasks, {args.workers} workers)", flush=True)
        finally:
            if pg:
                pg.stop()
    save(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
