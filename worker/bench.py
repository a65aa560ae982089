"""`dit-worker bench` (`make bench`): throughput and latency of three ways to make the same images,
run one after another in one process tree on the same device:

  baseline   a plain diffusers loop, one image at a time, as a user would write it;
  optimised  the worker's engine with the worker's settings ([speed], [batch]), no queue;
  worker     the full worker under torchrun, served by the reference scheduler on loopback, with
             the configured checks and a local store: lease, text check, broadcast, denoise, VAE,
             image check, encode, store, report.

For each it reports images/min, p50/p95 latency per task (the worker's: submit to result), a
per-stage breakdown, peak memory, and achieved TFLOP/s against the transformer's FLOP count; then
the ratios between them. `--sweep` adds the images/min of the optimised pipeline with each speed
switch added one at a time. Writes bench.json and bench.png to --out.

`--random-weights` builds the full-size FLUX.1-schnell architecture with random weights (no
download; speed does not depend on the values), and random base-size safety models.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from worker.config import WorkerConfig, load_config
from worker.distributed import pick_device
from worker.engine import peak_memory_mb
from worker.validation import Job

log = logging.getLogger(__name__)

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

# The speed switches added one at a time by --sweep, cumulatively.
SWEEP = [
    ("plain", []),
    ("+ fused QKV", ["speed.fuse_qkv=true"]),
    ("+ channels_last VAE", ["speed.channels_last_vae=true"]),
    ("+ attention backend", None),  # --attention NAME; skipped without it
    ("+ compile", ["speed.compile=true", "speed.compile_vae=true"]),
    ("+ fp8", ["speed.fp8=true"]),
    ("+ batch 4", ["batch.max_size=4"]),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/tiny.toml")
    p.add_argument("--out", type=Path, default=Path("var/bench"))
    p.add_argument("--images", type=int, default=16, help="images per phase and size")
    p.add_argument("--size", action="append", default=[], metavar="WxH",
                   help="repeatable; default: the config's warm-up sizes")
    p.add_argument("--nproc", type=int, default=1, help="ranks of the worker phase")
    p.add_argument("--random-weights", nargs="?", const="flux.1-schnell", default=None, metavar="ARCH",
                   help="build ARCH (default flux.1-schnell) with random weights instead of loading it")
    p.add_argument("--sweep", action="store_true", help="images/min per speed switch, added one at a time")
    p.add_argument("--attention", default="", help="attention backend for the sweep, e.g. _native_cudnn")
    p.add_argument("--phases", default="baseline,optimised,worker")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")


def run(args: argparse.Namespace) -> int:
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    for lib in (dlog, tlog):  # progress bars and per-call chatter would bury the figures
        lib.disable_progress_bar()
        lib.set_verbosity_error()
    args.out.mkdir(parents=True, exist_ok=True)
    overrides = list(args.set)
    if args.random_weights:
        overrides += [f"model.random_arch={args.random_weights}", *_random_safety(args.out / "models")]
    cfg = load_config(args.config, overrides)
    device = pick_device(cfg.model.device, local_rank=0)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.size] or list(cfg.warmup.sizes)
    phases = args.phases.split(",")
    report: dict = {"device": _describe(device), "config": args.config, "overrides": overrides,
                    "model": cfg.model.random_arch if cfg.model.random_arch != "none" else cfg.model.source,
                    "dtype": cfg.model.dtype, "steps": cfg.limits.default_steps, "images": args.images,
                    "batch_size": cfg.batch.max_size, "speed": cfg.speed.model_dump(), "sizes": {}}
    for width, height in sizes:
        jobs = _jobs(args.images, width, height, cfg.limits.default_steps)
        entry = report["sizes"][f"{width}x{height}"] = {}
        flops = transformer_flop(_transformer_config(cfg), width, height, cfg.model.max_sequence_length,
                                 cfg.limits.default_steps)
        entry["transformer_tflop_per_image"] = round(flops / 1e12, 4)
        if "baseline" in phases:
            entry["baseline"] = _finish(bare_baseline(cfg, jobs, device), flops)
        if "optimised" in phases:
            entry["optimised"] = _finish(bare_optimised(cfg, jobs, device), flops)
        if "worker" in phases:
            entry["worker"] = _finish(full_worker(args, overrides, jobs, args.out / f"run-{width}x{height}"), flops)
        entry["ratios"] = _ratios(entry)
        if args.sweep:
            entry["sweep"] = sweep(args, overrides, jobs, device, flops)
        _print(f"{width}x{height}", entry)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 0


# ---------------------------------------------------------------- the three phases

def bare_baseline(cfg: WorkerConfig, jobs: list[Job], device: torch.device) -> dict:
    """What a user writes first: from_pretrained, .to(device), call the pipeline per prompt."""
    from worker.engine import _build

    pipe = _build(cfg.model, device)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)

    def one(job: Job):
        return pipe(prompt=job.prompt, width=job.width, height=job.height, num_inference_steps=job.steps,
                    guidance_scale=cfg.model.guidance_scale, max_sequence_length=cfg.model.max_sequence_length,
                    generator=torch.Generator("cpu").manual_seed(job.seed)).images[0]

    one(jobs[0])  # warm-up, not counted (the worker warms up too)
    _reset_peak(device)
    latencies, t0 = [], time.perf_counter()
    for job in jobs:
        t = time.perf_counter()
        one(job)
        latencies.append(time.perf_counter() - t)
    result = _phase(len(jobs), time.perf_counter() - t0, latencies, {}, peak_memory_mb(device))
    pipe = None  # noqa: F841 (frees the model before the next phase)
    _free(device)
    return result


def bare_optimised(cfg: WorkerConfig, jobs: list[Job], device: torch.device) -> dict:
    """The worker's engine and settings, in this process, no queue, no checks, no storage."""
    from worker.engine import Engine

    engine = Engine.load(cfg.model, device, cfg.speed, cfg.parallel, world_size=1)
    n = cfg.batch.max_size
    for size in range(1, n + 1):  # the worker's warm-up: every batch size (compiles each shape)
        engine.generate_batch(jobs[:size] if size <= len(jobs) else [jobs[0]] * size)
    _reset_peak(device)
    latencies, stages, t0 = [], [], time.perf_counter()
    for i in range(0, len(jobs), n):
        chunk = jobs[i:i + n]
        t = time.perf_counter()
        batch = engine.generate_batch(chunk)
        latencies += [time.perf_counter() - t] * len(chunk)
        stages += [{k: v / len(chunk) for k, v in batch.timings.items()}] * len(chunk)
    result = _phase(len(jobs), time.perf_counter() - t0, latencies, _mean(stages), peak_memory_mb(device))
    engine = None  # noqa: F841
    _free(device)
    return result


def full_worker(args: argparse.Namespace, overrides: list[str], jobs: list[Job], workdir: Path) -> dict:
    """The worker as deployed: torchrun ranks, the reference scheduler, checks, a local store."""
    from launch.local import Client, free_port, start_scheduler, start_worker

    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scheduler = start_scheduler(workdir / "scheduler.db", port, workdir / "scheduler.log", lease_ttl=120.0)
    worker = None
    try:
        # The ranks share this machine's threads as the bare phases had them, so the comparison is fair.
        threads = str(max(1, torch.get_num_threads() // args.nproc))
        worker = start_worker(Path(args.config), args.nproc, workdir / "worker.log", [
            *overrides, f"queue.url={url}", "queue.heartbeat_interval_s=1.0", "storage.kind=local",
            f"storage.local.root={workdir / 'images'}"], env={"OMP_NUM_THREADS": threads})
        client = Client(url)
        _wait_ready(client, worker, timeout=1800)
        t0 = time.time()
        ids = [client.submit(_input(j))["id"] for j in jobs]
        done = client.wait(ids, timeout=600 + 60 * len(jobs), proc=worker)
        tasks = [done[i] for i in ids]
        failed = [t for t in tasks if t["status"] != "succeeded"]
        if failed:
            raise RuntimeError(f"{len(failed)} task(s) failed, e.g. {failed[0]['error']}")
        seconds = max(t["finished_at"] for t in tasks) - t0
        latencies = [t["finished_at"] - t["created_at"] for t in tasks]
        time.sleep(2.5)  # a heartbeat after the last report carries the final counters
        counters = client.http.get("/v1/workers").json()[0]["counters"]
        stages = _mean([_per_image(t["result"]) for t in tasks])
        if counters.get("reports"):
            stages["report"] = counters["report_us_total"] / counters["reports"] / 1e3
        result = _phase(len(jobs), seconds, latencies, stages, counters.get("peak_memory_mb", 0))
        result["idle_latency_ms"] = _idle_latency(client, worker, jobs[:min(5, len(jobs))])
        return result
    finally:
        if worker is not None:
            worker.stop(timeout=120)
        scheduler.stop()


def _idle_latency(client, worker, jobs: list[Job]) -> dict:
    """Submit to result with nothing else queued: one task at a time."""
    latencies = []
    for job in jobs:
        task_id = client.submit({**_input(job), "seed": job.seed + 1})["id"]
        task = client.wait([task_id], timeout=600, proc=worker)[task_id]
        latencies.append(task["finished_at"] - task["created_at"])
    return _percentiles(latencies)


def sweep(args, overrides: list[str], jobs: list[Job], device: torch.device, flops: float) -> list[dict]:
    """The optimised pipeline with each switch added to the ones before it."""
    from worker import speed

    # From everything off, whatever the config file turns on; later overrides win.
    off = ["speed.compile=false", "speed.compile_vae=false", "speed.fuse_qkv=false", "speed.channels_last_vae=false",
           "speed.attention_backend=''", "speed.fp8=false", "batch.max_size=1"]
    rows, current = [], [o for o in overrides if not o.startswith(("speed.", "batch."))] + off
    for label, extra in SWEEP:
        if extra is None:
            extra = [f"speed.attention_backend={args.attention}"] if args.attention else []
            if not extra:
                rows.append({"step": label, "skipped": "no --attention given"})
                continue
        trial = current + extra
        try:
            cfg = load_config(args.config, trial)
            speed.check(cfg.speed, cfg.parallel, device, 1)
        except Exception as e:  # this device cannot do it: say so, keep the switches before it
            rows.append({"step": label, "skipped": str(e)})
            continue
        current = trial
        row = _finish(bare_optimised(cfg, jobs, device), flops)
        rows.append({"step": label, "images_per_min": row["images_per_min"], "p50_ms": row["latency_ms"]["p50"],
                     "tflops": row["tflops"]})
        print(f"  sweep {label:24s} {row['images_per_min']:8.1f} images/min")
    return rows


# ---------------------------------------------------------------- arithmetic

def transformer_flop(tc: dict, width: int, height: int, text_tokens: int, steps: int) -> float:
    """FLOP of the FLUX transformer for one image: per block and token, the linear layers do 12 d^2
    multiply-adds (double blocks: QKV 3, out 1, MLP 8 per stream; single blocks: fused in 7, out 5),
    attention 2 L d per token (QK^T and AV). Embedders, T5, CLIP and the VAE are left out."""
    d = tc["num_attention_heads"] * tc["attention_head_dim"]
    blocks = tc["num_layers"] + tc["num_single_layers"]
    tokens = text_tokens + (width // 16) * (height // 16)
    per_block = 2 * (12 * d * d * tokens + 2 * tokens * tokens * d)
    return float(blocks * per_block * steps)


def _transformer_config(cfg: WorkerConfig) -> dict:
    if cfg.model.random_arch != "none":
        from worker.architectures import ARCHS

        return ARCHS[cfg.model.random_arch]["transformer"]
    from diffusers import FluxTransformer2DModel

    return dict(FluxTransformer2DModel.load_config(cfg.model.source, subfolder="transformer",
                                                   revision=cfg.model.revision))


def _phase(n: int, seconds: float, latencies: list[float], stages: dict, peak_mb: float) -> dict:
    return {"images": n, "seconds": round(seconds, 3), "images_per_min": round(60 * n / seconds, 2),
            "latency_ms": _percentiles(latencies), "stages_ms_per_image": {k: round(v, 2) for k, v in stages.items()},
            "peak_memory_mb": round(peak_mb)}


def _finish(phase: dict, flops: float) -> dict:
    phase["tflops"] = round(flops * phase["images"] / phase["seconds"] / 1e12, 4)
    return phase


def _ratios(entry: dict) -> dict:
    ips = {k: entry[k]["images_per_min"] for k in ("baseline", "optimised", "worker") if k in entry}
    out = {}
    if "baseline" in ips and "optimised" in ips:
        out["optimised_over_baseline"] = round(ips["optimised"] / ips["baseline"], 3)
    if "worker" in ips and "optimised" in ips:
        # Time per image, worker / bare optimised: the target is <= 1.05.
        out["worker_time_over_optimised"] = round(ips["optimised"] / ips["worker"], 3)
    if "worker" in ips and "baseline" in ips:
        out["worker_over_baseline"] = round(ips["worker"] / ips["baseline"], 3)
    return out


def _per_image(result: dict) -> dict:
    """A task's stage times; stages shared by a batch are divided among its images."""
    shared = {"embed", "denoise", "vae", "gather", "broadcast", "generate"}
    n = result.get("batch_size", 1) or 1
    return {k: (v / n if k in shared else v) for k, v in result.get("timings_ms", {}).items()}


def _mean(rows: list[dict]) -> dict:
    keys = {k for r in rows for k in r}
    return {k: statistics.fmean(r.get(k, 0.0) for r in rows) for k in sorted(keys)}


def _percentiles(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    return {"p50": round(statistics.median(ms), 1), "p95": round(ms[round(0.95 * (len(ms) - 1))], 1)}


# ---------------------------------------------------------------- plumbing

def _jobs(n: int, width: int, height: int, steps: int) -> list[Job]:
    return [Job(task_id=f"bench-{i}", prompt=PROMPTS[i % len(PROMPTS)] + f", variation {i}", width=width,
                height=height, steps=steps, seed=1000 + i, output_format="png") for i in range(n)]


def _input(job: Job) -> dict:
    return {"prompt": job.prompt, "width": job.width, "height": job.height, "steps": job.steps, "seed": job.seed}


def _wait_ready(client, worker, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not worker.alive():
            raise RuntimeError(f"worker exited:\n{worker.output()[-4000:]}")
        workers = client.http.get("/v1/workers").json()
        if workers and workers[0]["status"] == "ready":
            return
        time.sleep(0.2)
    raise TimeoutError("worker not ready")


def _random_safety(models: Path) -> list[str]:
    """Base-size detoxify and ViT with random weights, thresholds that flag nothing: their cost, not
    their verdicts, is what the benchmark needs."""
    from safety.random_models import make_detoxify_checkpoint, make_vit_classifier

    ckpt = make_detoxify_checkpoint(models / "detoxify", size="base")
    vit = make_vit_classifier(models / "vit", size="base")
    return ["safety.text.backend=detoxify", f"safety.text.detoxify.checkpoint={ckpt}",
            f"safety.text.detoxify.huggingface_config_path={Path(ckpt).parent}",
            "safety.text.detoxify.model_type=original", "safety.text.detoxify.thresholds={ toxicity = 1.0 }",
            "safety.image.backend=hf", f"safety.image.hf.model={vit}", "safety.image.hf.threshold=1.0"]


def _describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _print(size: str, entry: dict) -> None:
    print(f"{size}: {entry['transformer_tflop_per_image']} transformer TFLOP per image")
    for name in ("baseline", "optimised", "worker"):
        if name in entry:
            e = entry[name]
            print(f"  {name:10s} {e['images_per_min']:8.1f} images/min  p50 {e['latency_ms']['p50']:8.1f} ms  "
                  f"p95 {e['latency_ms']['p95']:8.1f} ms  {e['tflops']:.3f} TFLOP/s  peak {e['peak_memory_mb']} MB")
    print(f"  ratios {entry['ratios']}")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    sizes = list(report["sizes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [n for n in ("baseline", "optimised", "worker") if any(n in report["sizes"][s] for s in sizes)]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [report["sizes"][s].get(name, {}).get("images_per_min", 0) for s in sizes]
        left.bar([x + i * width for x in range(len(sizes))], values, width, label=name)
    left.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(sizes))], sizes)
    left.set_ylabel("images / min")
    left.set_title(f"{report['model']} on {report['device']}", fontsize=9)
    left.legend()
    worker = {s: report["sizes"][s].get("worker", {}).get("stages_ms_per_image", {}) for s in sizes}
    stages = ["lease", "text_check", "admit", "broadcast", "embed", "denoise", "vae", "gather", "image_check",
              "encode", "store", "report"]
    bottom = [0.0] * len(sizes)
    for i, stage in enumerate(stages):
        values = [worker[s].get(stage, 0.0) for s in sizes]
        right.bar(range(len(sizes)), values, bottom=bottom, label=stage, color=plt.cm.tab20(i))
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_xticks(range(len(sizes)), sizes)
    right.set_ylabel("ms per image (worker, summed stages)")
    right.set_title("where the worker's time goes (stages overlap in time)", fontsize=9)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
