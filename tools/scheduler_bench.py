"""`dit-scheduler bench` (`make bench-scheduler`): the reference scheduler under N simulated workers
speaking the real protocol over loopback, for each backend side by side in one run: SQLite, and
PostgreSQL with one and with two scheduler processes (the workers split between them).

Every worker registers; then the tasks are submitted in batches of 100 (submits/s is measured on its
own); then the workers start, each looping: lease (up to --lease-max tasks, long poll), report
`processing` and `succeeded` for each task: one call per report with --lease-max 1 (a rank taking one
task at a time), or all of a lease's reports in one POST /v1/reports call per status (a node's round).
lifecycles/s is tasks / (last success - start), every task going lease -> processing -> succeeded
while work is queued; lease latency is that of the calls that returned work. With --work-s each
worker spends that long per task between `processing` and `succeeded`, like a GPU (0.4 s: one H100
at about 2.5 images/s): an open load instead of workers that do nothing but call the scheduler.
Prints a table and writes JSON to --out. PostgreSQL runs as a real server started for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from launch.local import Postgres, free_port, start_scheduler

REG = {"hostname": "bench", "world_size": 1, "devices": [{"name": "sim", "memory_bytes": 0}], "model": "sim",
       "version": "bench"}
RESULT = {"uri": "file:///bench.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 1,
          "bytes": 1, "sha256": "0"}


async def simulate(urls: list[str], workers: int, tasks: int, lease_max: int, work_s: float = 0.0) -> dict:
    # A client (one connection) per simulated worker, as real workers have: one AsyncClient shared by
    # hundreds of concurrent requests spends its time in its own pool (~280 requests/s here).
    clients = [httpx.AsyncClient(base_url=urls[n % len(urls)], timeout=60) for n in range(workers)]
    lease_ms: list[float] = []
    go, done = asyncio.Event(), asyncio.Event()
    finished = 0
    last = 0.0

    async def worker(http: httpx.AsyncClient, wid: str) -> None:
        nonlocal finished, last
        await go.wait()
        while not done.is_set():
            t = time.perf_counter()
            resp = await http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": lease_max, "wait_s": 10.0})
            if resp.status_code != 200:
                continue
            lease_ms.append((time.perf_counter() - t) * 1e3)
            ok = await report(http, wid, resp.json()["leases"])  # not `finished += await ...`: that reads
            finished += ok  # `finished` before the await and loses other workers' additions
            last = time.perf_counter()
            if finished >= tasks:
                done.set()

    async def report(http: httpx.AsyncClient, wid: str, leases: list[dict]) -> int:
        if lease_max == 1:  # one call per report
            ok = 0
            for le in leases:
                body = {"worker_id": wid, "lease_token": le["lease_token"]}
                await http.post(f"/v1/tasks/{le['task_id']}/report", json={**body, "status": "processing"})
                await asyncio.sleep(work_s)
                resp = await http.post(f"/v1/tasks/{le['task_id']}/report",
                                       json={**body, "status": "succeeded", "result": RESULT})
                ok += resp.status_code == 200
            return ok
        for status, extra in (("processing", {}), ("succeeded", {"result": RESULT})):
            if status == "succeeded" and work_s:
                await asyncio.sleep(work_s * len(leases))
            resp = await http.post("/v1/reports", json={"reports": [
                {"task_id": le["task_id"], "worker_id": wid, "lease_token": le["lease_token"], "status": status,
                 **extra} for le in leases]})
        return sum(r["status_code"] == 200 for r in resp.json()["results"])

    ids = await asyncio.gather(*[c.post("/v1/workers", json=REG) for c in clients])
    runners = [asyncio.create_task(worker(c, r.json()["worker_id"])) for c, r in zip(clients, ids)]
    t_submit = time.perf_counter()
    for start in range(0, tasks, 100):
        batch = [{"input": {"prompt": f"bench {i}"}} for i in range(start, min(tasks, start + 100))]
        (await clients[0].post("/v1/tasks/batch", json={"tasks": batch})).raise_for_status()
    submit_s = time.perf_counter() - t_submit
    t0 = time.perf_counter()
    go.set()
    await asyncio.wait_for(done.wait(), timeout=600)
    for r in runners:
        r.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    for c in clients:
        await c.aclose()
    seconds = last - t0
    lease_ms.sort()
    return {"tasks": tasks, "seconds": round(seconds, 3), "lifecycles_per_s": round(tasks / seconds, 1),
            "submits_per_s": round(tasks / submit_s, 1), "lease_p50_ms": round(statistics.median(lease_ms), 2),
            "lease_p99_ms": round(lease_ms[int(0.99 * (len(lease_ms) - 1))], 2), "leases": len(lease_ms)}


def run_backend(name: str, args, work: Path, pg: Postgres | None) -> dict:
    db = str(work / f"{name}.db") if name == "sqlite" else pg.fresh()
    procs, urls = [], []
    for i in range(2 if name == "postgres-2" else 1):
        port = free_port()
        procs.append(start_scheduler(db, port, work / f"{name}-{i}.log", lease_ttl=60.0,
                                     extra=["--max-queued", str(args.tasks + 1), "--log-level", "WARNING"]))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        return asyncio.run(simulate(urls, args.workers, args.tasks, args.lease_max, args.work_s))
    finally:
        for p in procs:
            p.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dit-scheduler bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=500)
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--lease-max", type=int, default=1, help="max_tasks per lease call (a GPU rank takes 1)")
    p.add_argument("--backends", default="sqlite,postgres,postgres-2")
    p.add_argument("--work-s", type=float, default=0.0, help="simulated GPU time per task; 0: none")
    p.add_argument("--out", type=Path, default=Path("var/bench/scheduler.json"))
    args = p.parse_args(argv)
    backends = args.backends.split(",")
    report = {"machine": platform.processor() or platform.machine(), "workers": args.workers, "tasks": args.tasks,
              "lease_max": args.lease_max, "work_s": args.work_s, "backends": {}}
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
