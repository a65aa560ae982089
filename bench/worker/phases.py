"""The benchmark's phases, the first three making the same images on the same device:

  baseline   a plain diffusers loop, one image at a time, as a user would write it;
  optimised  the worker's engine with the worker's settings ([speed], [batch]), no queue;
  worker     the full worker under torchrun, served by the reference scheduler on loopback, with
             the configured checks and a local store;
  ready      the worker's time from start to ready, twice: with an empty compile cache, then warm.

Each reports its steps (load, warm-up, measure) to the run's Progress as they start and end.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import time
from pathlib import Path

import torch

from bench.plain_client import PlainClient
from launch.local import free_port, start_scheduler, start_worker, wait_until
from bench.worker.figures import mean, per_image, percentiles, phase
from bench.worker.progress import Progress
from worker.config import WorkerConfig
from worker.model.engine import Engine, load_pipeline, peak_memory_mb
from worker.model.job import Job

PROMPTS = [
    "a lighthouse on a rocky cliff at dawn, waves crashing below, golden light",
    "a red fox in fresh snow, watercolour",
    "an astronaut riding a horse on the moon, 35mm film",
    "a bowl of ramen on a wooden table, studio lighting",
    "a cathedral made of glass in a pine forest",
    "a tiny robot reading a book in a library",
    "a street market in the rain at night, neon reflections",
    "a hot air balloon over terraced rice fields",
]



def bare_baseline(cfg: WorkerConfig, jobs: list[Job], device: torch.device, progress: Progress) -> dict:
    """What a user writes first: from_pretrained, .to(device), call the pipeline per prompt."""
    with progress.step("load"):
        pipe = load_pipeline(cfg.model, device)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)

    def one(job: Job):
        return pipe(prompt=job.prompt, width=job.width, height=job.height, num_inference_steps=job.steps,
                    guidance_scale=cfg.model.guidance_scale, max_sequence_length=cfg.model.max_sequence_length,
                    generator=torch.Generator("cpu").manual_seed(job.seed)).images[0]

    try:
        with progress.step("warm-up"):
            one(jobs[0])  # not counted (the worker warms up too)
        with progress.step(f"measure ({len(jobs)} images)"):
            _reset_peak(device)
            latencies, t0 = [], time.perf_counter()
            for job in jobs:
                t = time.perf_counter()
                one(job)
                latencies.append(time.perf_counter() - t)
            return phase(len(jobs), time.perf_counter() - t0, latencies, {}, peak_memory_mb(device))
    finally:
        pipe = None  # noqa: F841 (frees the model before the next phase, also after a failure)
        _free(device)


def bare_optimised(cfg: WorkerConfig, jobs: list[Job], device: torch.device, progress: Progress,
                   profile_dir: Path | None = None) -> dict:
    """The worker's engine and settings, in this process, no queue, no checks, no storage. With
    `profile_dir`, torch.profiler then records one step and one image of the warm engine."""
    with progress.step("load"):
        engine = Engine.load(cfg.model, device, cfg.speed, cfg.parallel, world_size=1)
    try:
        n = cfg.batch.max_size
        with progress.step("warm-up (compiles, when compile is on)"):
            for size in range(1, n + 1):  # the worker's warm-up: every batch size (compiles each shape)
                engine.generate_batch(jobs[:size] if size <= len(jobs) else [jobs[0]] * size)
        with progress.step(f"measure ({len(jobs)} images)"):
            _reset_peak(device)
            latencies, stages, t0 = [], [], time.perf_counter()
            for i in range(0, len(jobs), n):
                chunk = jobs[i:i + n]
                t = time.perf_counter()
                batch = engine.generate_batch(chunk)
                latencies += [time.perf_counter() - t] * len(chunk)
                stages += [{k: v / len(chunk) for k, v in batch.timings.items()}] * len(chunk)
            result = phase(len(jobs), time.perf_counter() - t0, latencies, mean(stages), peak_memory_mb(device))
        if profile_dir is not None:
            from bench.worker.profile import profile_engine

            with progress.step("profile (one step, one image)"):
                job = jobs[0]
                result["profile"] = profile_engine(engine, job, profile_dir, f"{job.width}x{job.height}")
        return result
    finally:
        engine = None  # noqa: F841
        _free(device)


def full_worker(args: argparse.Namespace, overrides: list[str], jobs: list[Job], workdir: Path,
                progress: Progress, nproc: int | None = None, idle_latency: bool = True) -> dict:
    """The worker as deployed: torchrun ranks, the reference scheduler, checks, a local store."""
    nproc = nproc or args.nproc
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scheduler = start_scheduler(workdir / "scheduler.db", port, workdir / "scheduler.log", lease_ttl=120.0)
    worker = None
    try:
        with progress.step(f"start {nproc} rank(s), load, warm up: until ready (log: {workdir}/worker.log)"):
            worker = _start(args, overrides, nproc, workdir, url)
            client = PlainClient(url)
            _wait_ready(client, worker, timeout=1800)
        with progress.step(f"measure ({len(jobs)} tasks in a burst)"):
            t0 = time.time()
            ids = [client.submit(_input(j))["id"] for j in jobs]
            done = client.wait(ids, timeout=600 + 60 * len(jobs), proc=worker)
        tasks = [done[i] for i in ids]
        failed = [t for t in tasks if t["status"] != "succeeded"]
        if failed:
            raise RuntimeError(f"{len(failed)} task(s) failed, e.g. {failed[0]['error']}")
        seconds = max(t["finished_at"] for t in tasks) - t0
        latencies = [t["finished_at"] - t["created_at"] for t in tasks]
        last = max(t["finished_at"] for t in tasks)
        # A heartbeat sent after the last report carries the final counters.
        worker_view = wait_until(lambda: next((w for w in client.http.get("/v1/workers").json()
                                               if (w["last_heartbeat"] or 0) > last), None),
                                 30, "a heartbeat after the last report", proc=worker)
        counters = worker_view["counters"]
        stages = mean([per_image(t["result"]) for t in tasks])
        if counters.get("reports"):
            stages["report"] = counters["report_us_total"] / counters["reports"] / 1e3
        result = phase(len(jobs), seconds, latencies, stages, counters.get("peak_memory_mb", 0))
        result["ranks"] = nproc
        result["images_per_rank"] = [sum(t["result"]["rank"] == r for t in tasks) for r in range(nproc)]
        result["unreported_max"] = counters.get("unreported_max", 0)
        if idle_latency:
            with progress.step("one task at a time"):
                result["idle_latency_ms"] = _idle_latency(client, worker, jobs[:min(5, len(jobs))])
        if args.profile:
            with progress.step(f"profile {PROFILE_ROUNDS} rounds of a second burst (rank 0, every thread and stream)"):
                try:
                    result["profile"] = _profile_burst(client, worker, jobs)
                except Exception as e:  # the figures above stand without it
                    result["profile"] = {"error": f"{type(e).__name__}: {e}"}
                    progress.say(f"  the worker's profile failed: {result['profile']['error']}")
        return result
    finally:
        if worker is not None:
            worker.stop(timeout=120)
        scheduler.stop()


PROFILE_ROUNDS = 8


def _profile_burst(client, worker, jobs: list[Job]) -> dict:
    """Arms the worker's profiler (POST /profile on its ops endpoint) for PROFILE_ROUNDS rounds,
    submits a burst of as many tasks plus a round's worth so the last profiled round is not the
    queue's tail, waits for the trace and summarises it."""
    import httpx

    from bench.worker.profile import summarize_trace

    ops_url = client.http.get("/v1/workers").json()[0]["ops_url"]
    armed = httpx.post(f"{ops_url}/profile", params={"rounds": PROFILE_ROUNDS}, timeout=10)
    armed.raise_for_status()
    trace = Path(armed.json()["trace"])
    # New prompts: a prompt cache would skip the text encoders for the first burst's.
    burst = [{**_input(j), "prompt": f"{j.prompt}, profiled {i}"}
             for i, j in enumerate((jobs * (1 + PROFILE_ROUNDS // max(1, len(jobs))))[:PROFILE_ROUNDS + 2])]
    ids = [client.submit(task)["id"] for task in burst]
    client.wait(ids, timeout=600 + 60 * len(burst), proc=worker)

    def written():
        status = httpx.get(f"{ops_url}/profile", timeout=10).json()
        return status if status["state"] in ("done", "failed") else None

    status = wait_until(written, 300, "the worker's trace to be written", proc=worker)
    if status["state"] != "done":
        raise RuntimeError(f"the worker's profile failed: {status['error']}")
    return {"trace": str(trace), "table": str(trace.with_name(trace.name.replace(".json.gz", ".txt"))),
            "rounds": status["rounds_done"], **summarize_trace(trace)}


def time_to_ready(args: argparse.Namespace, overrides: list[str], workdir: Path, progress: Progress) -> dict:
    """Seconds from starting the worker to its being ready (loaded, compiled, warmed up for every
    warm-up size and batch size), first with an empty compile cache, then again with the cache the
    first start left: the restart of a node that has run before."""
    cache = workdir / "compile-cache"
    shutil.rmtree(cache, ignore_errors=True)
    overrides = [*overrides, f"speed.compile_cache_dir={cache}"]
    out = {"compile_cache_dir": str(cache)}
    for kind in ("cold", "warm"):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        scheduler = start_scheduler(workdir / f"scheduler-{kind}.db", port, workdir / f"scheduler-{kind}.log")
        worker = None
        try:
            with progress.step(f"{kind} start (log: {workdir}/worker-{kind}.log)") as record:
                t0 = time.monotonic()
                worker = _start(args, overrides, args.nproc, workdir, url, log=f"worker-{kind}.log")
                _wait_ready(PlainClient(url), worker, timeout=3600)
                out[f"{kind}_s"] = record["ready_s"] = round(time.monotonic() - t0, 2)
        finally:
            if worker is not None:
                worker.stop(timeout=120)
            scheduler.stop()
        out[f"{kind}_cache"] = _cache_line(worker.messages()) if worker else ""
    out["cache_mb"] = round(sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20, 1)
    out["warm_over_cold"] = round(out["warm_s"] / out["cold_s"], 3)
    return out


def _start(args: argparse.Namespace, overrides: list[str], nproc: int, workdir: Path, url: str,
           log: str = "worker.log"):
    # The ranks share this machine's threads as the bare phases had them, so the comparison is fair.
    threads = str(max(1, torch.get_num_threads() // nproc))
    profile = [f"ops.profile_dir={workdir / 'profile'}"] if args.profile else []
    return start_worker(Path(args.config), nproc, workdir / log, [
        *overrides, f"queue.url={url}", "queue.heartbeat_interval_s=1.0", "storage.kind=local",
        f"storage.local.root={workdir / 'images'}", "ops.port=0", "ops.host=127.0.0.1", *profile],
        env={"OMP_NUM_THREADS": threads})


def _cache_line(messages: str) -> str:
    """The worker's own account of the cache: how many graphs it loaded and compiled."""
    lines = [line for line in messages.splitlines() if "graph(s) loaded" in line]
    return lines[-1].strip() if lines else ""


def _idle_latency(client, worker, jobs: list[Job]) -> dict:
    """Submit to result with nothing else queued: one task at a time."""
    latencies = []
    for job in jobs:
        # A prompt of its own: the burst's would hit the prompt cache and skip the text encoders.
        task_id = client.submit({**_input(job), "prompt": f"{job.prompt}, alone", "seed": job.seed + 1})["id"]
        task = client.wait([task_id], timeout=600, proc=worker)[task_id]
        latencies.append(task["finished_at"] - task["created_at"])
    return percentiles(latencies)


def make_jobs(n: int, width: int, height: int, steps: int) -> list[Job]:
    return mixed_jobs(n, [(width, height)], steps)


def mixed_jobs(n: int, sizes: list[tuple[int, int]], steps: int) -> list[Job]:
    """n jobs whose sizes cycle through `sizes`, in submission order."""
    return [Job(task_id=f"bench-{i}", prompt=PROMPTS[i % len(PROMPTS)] + f", variation {i}",
                width=sizes[i % len(sizes)][0], height=sizes[i % len(sizes)][1], steps=steps, seed=1000 + i,
                output_format="png") for i in range(n)]


def _input(job: Job) -> dict:
    return {"prompt": job.prompt, "width": job.width, "height": job.height, "steps": job.steps, "seed": job.seed}


def _wait_ready(client, worker, timeout: float) -> None:
    def ready() -> bool:
        workers = client.http.get("/v1/workers").json()
        return bool(workers) and workers[0]["status"] == "ready"

    wait_until(ready, timeout, "the worker to be ready", proc=worker)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


