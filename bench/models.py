"""`make bench-models`: several models on one fleet, affinity routing against plain FIFO, side by
side in one run.

A real scheduler (SQLite, in a temporary folder) serves --models models; --workers simulated
single-GPU workers speak the real protocol over loopback, each holding one model at a time: a task
of another model costs a swap of --swap-s before its --work-s (+-20%) of generation, as a worker
evicting and loading does. Each lease says what the worker holds (`resident`), as the worker's do.
Clients submit one task per call on an open-loop Poisson schedule at --load x what the workers make
without swaps, each task's model drawn with the weights --mix. The same seeded schedule runs against
`models.route = "affinity"` and `"fifo"` (the oldest task of any model a worker serves, held or not).

Figures per route: tasks completed, swaps per 100 tasks, the queue wait (submit -> lease) p50 and
p95, overall and per model, and the workers' share of time spent swapping.

With --adapter-sets N, the same for LoRA adapters on one model: each task brings one of N sets of
adapters (drawn by a Zipf law, s = 1.1); a worker holds its --held most recently used sets, and a
task of another set costs --adapter-load-s (fetch and load) before its work. Two runs: "adapters",
where each lease says the sets the worker holds (as the dit-worker's do) and the scheduler leaves a
held set's task to its holder for models.adapter_wait_s; and "blind", where leases say nothing and
adapter_wait_s is 0 (first come, first served). Figures: loads per 100 tasks instead of swaps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from launch.local import free_port, start_scheduler
from bench.reports import save
from protocol import adapter_set_key

REG = {"hostname": "models-bench", "world_size": 1, "devices": [{"name": "sim", "memory_bytes": 0}],
       "version": "bench"}
RESULT = {"uri": "file:///bench.jpg", "content_type": "image/jpeg", "width": 16, "height": 16, "seed": 1,
          "bytes": 1, "sha256": "0"}


@dataclass
class Run:
    """What one route's run saw."""

    waits: dict[str, list[float]] = field(default_factory=dict)  # model -> submit -> lease seconds
    submitted: dict[str, tuple[float, str]] = field(default_factory=dict)  # task id -> (sent, model)
    done: int = 0
    swaps: int = 0
    swap_s: float = 0.0
    busy_s: float = 0.0


@dataclass(frozen=True)
class Plan:
    models: list[str]
    mix: list[float]
    workers: int
    work_s: float
    swap_s: float
    rate: float
    seconds: float
    seed: int
    sets: int = 0  # sets of adapters the tasks bring (0: none; models are routed instead)
    held: int = 3  # sets a worker keeps loaded
    load_s: float = 1.0  # fetch and load a set it does not hold
    say: bool = True  # leases say the sets held

    def schedule(self) -> list[tuple[float, str]]:
        """(offset from the start, model) of every submit: the same for each route."""
        rng, t, out = random.Random(self.seed), 0.0, []
        weights = [1 / (k + 1) ** 1.1 for k in range(self.sets)]
        while (t := t + rng.expovariate(self.rate)) < self.seconds:
            what = rng.choices(self.models, self.mix)[0]
            out.append((t, f"{what}/set-{rng.choices(range(self.sets), weights)[0]}" if self.sets else what))
        return out


async def run_route(plan: Plan, url: str) -> Run:
    run, stop = Run(), asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        starts = [plan.models[i % len(plan.models)] for i in range(plan.workers)]
        workers = [asyncio.create_task(_worker(http, plan, run, stop, model, i)) for i, model in enumerate(starts)]
        await asyncio.sleep(0.5)  # every worker registered and in its first long poll
        await _offer(http, plan, run)
        end = time.perf_counter() + plan.seconds  # the backlog gets as long again to drain
        while run.done < len(run.submitted) and time.perf_counter() < end:
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
    return run


async def _offer(http: httpx.AsyncClient, plan: Plan, run: Run) -> None:
    start, pending = time.perf_counter(), []
    for offset, model in plan.schedule():
        if (delay := start + offset - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(_submit(http, model, run)))
    await asyncio.gather(*pending)


async def _submit(http: httpx.AsyncClient, what: str, run: Run) -> None:
    """`what`: a model, or a model and a set of adapters ("model/set-3")."""
    sent = time.perf_counter()
    model, _, adapters = what.partition("/")
    loras = [{"source": f"https://bench.invalid/{adapters}.safetensors"}] if adapters else None
    r = await http.post("/v1/tasks", json={"input": {"prompt": "bench"} | ({"loras": loras} if loras else {}),
                                           "model": model})
    r.raise_for_status()
    run.submitted[r.json()["id"]] = (sent, model)


async def _worker(http: httpx.AsyncClient, plan: Plan, run: Run, stop: asyncio.Event, model: str, i: int) -> None:
    rng = random.Random(plan.seed + 1 + i)
    wid = (await http.post("/v1/workers", json={**REG, "model": model, "models": {
        "resident": [model], "loadable": [m for m in plan.models if m != model]}})).json()["worker_id"]
    last_beat = time.perf_counter()
    held: list[str] = []  # the sets of adapters it holds, most recent last
    while not stop.is_set():
        if time.perf_counter() - last_beat > 20:  # well inside the scheduler's liveness time
            await http.post(f"/v1/workers/{wid}/heartbeat", json={"status": "ready", "timestamp": time.time()})
            last_beat = time.perf_counter()
        ask = {"max_tasks": 1, "wait_s": 1.0, "resident": [model]} | ({"adapters": held} if plan.say and held else {})
        r = await http.post(f"/v1/workers/{wid}/lease", json=ask)
        if r.status_code != 200:
            continue
        (lease,) = r.json()["leases"]
        if (seen := run.submitted.get(lease["task_id"])) is not None:
            run.waits.setdefault(lease["model"], []).append(time.perf_counter() - seen[0])
        if lease["model"] != model:  # evict, load, warm up
            model = lease["model"]
            run.swaps += 1
            run.swap_s += plan.swap_s
            await asyncio.sleep(plan.swap_s)
        if key := adapter_set_key(lease["input"].get("loras")):
            if key not in held:  # fetch and load it, the least recently used going
                run.swaps += 1
                run.swap_s += plan.load_s
                await asyncio.sleep(plan.load_s)
            held = ([k for k in held if k != key] + [key])[-plan.held:]
        work = plan.work_s * rng.uniform(0.8, 1.2)
        run.busy_s += work
        await asyncio.sleep(work)
        await http.post(f"/v1/tasks/{lease['task_id']}/report", json={
            "worker_id": wid, "lease_token": lease["lease_token"], "status": "succeeded", "result": RESULT})
        run.done += 1


def figures(run: Run, plan: Plan) -> dict:
    every = [w for ws in run.waits.values() for w in ws]
    return {"offered": len(plan.schedule()), "completed": run.done,
            "swaps_per_100_tasks": round(100 * run.swaps / max(run.done, 1), 1),
            "wait_p50_s": _pct(every, 50), "wait_p95_s": _pct(every, 95),
            "wait_p95_s_by_model": {m: _pct(run.waits.get(m, []), 95) for m in plan.models},
            "swapping_share": round(run.swap_s / max(run.swap_s + run.busy_s, 1e-9), 3)}


def _pct(values: list[float], p: int) -> float | None:
    if len(values) < 2:
        return round(values[0], 2) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[p - 1], 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=int, default=3)
    p.add_argument("--mix", default="0.5,0.3,0.2", help="each model's share of the traffic")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work-s", type=float, default=0.5)
    p.add_argument("--swap-s", type=float, default=3.0, help="evict, load and warm up another model")
    p.add_argument("--load", type=float, default=0.6, help="offered tasks/s as a share of what the workers make")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--cold-wait-s", type=float, default=10.0, help="the scheduler's models.cold_wait_s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--routes", default="affinity,fifo", help="the scheduler's models.route values to run")
    p.add_argument("--adapter-sets", type=int, default=0, help="sets of LoRA adapters the tasks bring (0: models)")
    p.add_argument("--held", type=int, default=3, help="sets of adapters a worker keeps loaded")
    p.add_argument("--adapter-load-s", type=float, default=1.0, help="fetch and load a set the worker lacks")
    p.add_argument("--adapter-wait-s", type=float, default=2.0, help="the scheduler's models.adapter_wait_s")
    p.add_argument("--out", type=Path, default=Path("var/bench/models.json"))
    args = p.parse_args(argv)
    names = [f"model-{chr(ord('a') + i)}" for i in range(args.models)]
    mix = [float(x) for x in args.mix.split(",")]
    if len(mix) != len(names):
        p.error(f"--mix: {len(mix)} shares for {len(names)} models")
    plan = Plan(names, mix, args.workers, args.work_s, args.swap_s, args.load * args.workers / args.work_s,
                args.seconds, args.seed, args.adapter_sets, args.held, args.adapter_load_s)
    report = {"plan": {**plan.__dict__, "cold_wait_s": args.cold_wait_s, "adapter_wait_s": args.adapter_wait_s},
              "routes": {}}
    routes = ["adapters", "blind"] if args.adapter_sets else args.routes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for route in routes:
            port = free_port()
            settings = [f"models.ids={json.dumps(names)}", f"models.cold_wait_s={args.cold_wait_s}",
                        f"models.adapter_wait_s={args.adapter_wait_s if route != 'blind' else 0}"]
            settings.append(f'models.route="{route if route in ("affinity", "fifo") else "affinity"}"')
            proc = start_scheduler(Path(tmp) / f"{route}.db", port, Path(tmp) / f"{route}.log",
                                   extra=[a for setting in settings for a in ("--set", setting)])
            try:
                run = asyncio.run(run_route(replace(plan, say=route != "blind"), f"http://127.0.0.1:{port}"))
            finally:
                proc.stop()
            report["routes"][route] = row = figures(run, plan)
            print(f"{route:<9} completed {row['completed']}/{row['offered']}  "
                  f"{'loads' if args.adapter_sets else 'swaps'}/100 tasks "
                  f"{row['swaps_per_100_tasks']:>5}  wait p50 {row['wait_p50_s']}s p95 {row['wait_p95_s']}s  "
                  f"p95 by model {row['wait_p95_s_by_model']}  time swapping {row['swapping_share']:.0%}",
                  flush=True)
    save(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
