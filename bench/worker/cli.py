"""`python -m bench worker` (`make bench`): throughput and latency of three ways to make the same images,
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

It reports as it goes: every phase and step (load, compile and warm-up, measure) prints when it
starts and ends, and bench.json is rewritten after each, so a run stopped early keeps what it
finished (its `phases` list says what ran, for how long, and how it ended). `--phase-limit-s` bounds
each phase: one that runs past it is recorded as timed out and the run goes on. SIGTERM stops the
run after saving; the exit code is 0 only if every phase succeeded.

`--phases ready` measures the worker's time from start to ready, with an empty compile cache and
then warm (`speed.compile_cache_dir`). `--profile` writes a torch.profiler trace and a per-operator
table of one denoising step and one whole image of the optimised engine (profile-*.json.gz, *.txt).

`--mixed` measures the worker phase alone on mixed traffic (sizes cycling 256x256, 384x256, 512x512
unless --size is given) with 1 rank and with --nproc ranks (default 2), one after the other in one
run: images/min, the ratio, and each rank's share of the images.

`--random-weights` builds the full-size FLUX.1-schnell architecture with random weights (no
download; speed does not depend on the values), and random base-size safety models.
"""

from __future__ import annotations

import argparse
import logging
import platform
import signal
from pathlib import Path

import torch

from bench.worker import phases
from bench.worker.figures import ratios, transformer_config, transformer_flop, with_tflops
from bench.worker.plot import plot
from bench.worker.progress import Interrupted, Progress, on_sigterm
from bench.random_safety import bench_overrides
from worker.config import load_config
from worker.model import speed
from worker.ranks.distributed import pick_device

log = logging.getLogger(__name__)

# The speed switches added one at a time by --sweep, cumulatively.
SWEEP = [
    ("plain", []),
    ("+ fused QKV", ["speed.fuse_qkv=true"]),
    ("+ channels_last VAE", ["speed.channels_last_vae=true"]),
    ("+ attention backend", None),  # --attention NAME; skipped without it
    ("+ compile", ["speed.compile=true", "speed.compile_vae=true"]),
    ("  compile by blocks instead", ["speed.compile_scope=blocks"]),  # the alternative, not kept
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
    p.add_argument("--weights-dir", type=Path, default=None, metavar="DIR",
                   help="with --random-weights: save the random pipeline to DIR once (save_pretrained) and "
                        "load it from there in every phase, as a node loads its model from local disk")
    p.add_argument("--sweep", action="store_true", help="images/min per speed switch, added one at a time")
    p.add_argument("--attention", default="", help="attention backend for the sweep, e.g. _native_cudnn")
    p.add_argument("--phases", default="baseline,optimised,worker",
                   help="comma-separated: baseline, optimised, worker, ready")
    p.add_argument("--phase-limit-s", type=float, default=0.0, help="time limit per phase; 0: none")
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler traces: one step and one image of the optimised engine; 8 rounds of a "
                        "second burst of the whole worker (rank 0's every thread and CUDA stream)")
    p.add_argument("--mixed", action="store_true", help="the worker on mixed sizes, 1 rank against --nproc ranks")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")


def main(argv: list[str]) -> int:
    """`python -m bench worker ...`."""
    p = argparse.ArgumentParser(prog="python -m bench worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    for lib in (dlog, tlog):  # progress bars and per-call chatter would bury the figures
        lib.disable_progress_bar()
        lib.set_verbosity_error()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = [w.strip() for w in args.phases.split(",") if w.strip()]
    if unknown := set(wanted) - {"baseline", "optimised", "worker", "ready"}:
        raise SystemExit(f"--phases: unknown {', '.join(sorted(unknown))}")
    if args.profile and not {"optimised", "worker"} & set(wanted):
        raise SystemExit("--profile: profiles the optimised engine and the worker; add either to --phases")
    overrides = list(args.set)
    if args.weights_dir and not args.random_weights:
        raise SystemExit("--weights-dir: saves random weights; add --random-weights")
    if args.random_weights:
        overrides += bench_overrides(args.out / "models")
        if args.weights_dir:
            dtype = load_config(args.config, overrides).model.dtype
            source = saved_random_pipeline(args.random_weights, args.weights_dir, dtype)
            overrides += [f"model.source={source}", "model.random_arch=none"]
        else:
            overrides += [f"model.random_arch={args.random_weights}"]
    cfg = load_config(args.config, overrides)
    device = pick_device(cfg.model.device, local_rank=0, dtype=cfg.model.dtype)
    report: dict = {"device": _describe(device), "torch": torch.__version__, "config": args.config,
                    "overrides": overrides,
                    "model": cfg.model.random_arch if cfg.model.random_arch != "none" else cfg.model.source,
                    "dtype": cfg.model.dtype, "steps": cfg.limits.default_steps, "images": args.images,
                    "batch_size": cfg.batch.max_size, "speed": cfg.speed.model_dump(), "sizes": {}}
    progress = Progress(report, args.out / "bench.json")
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if args.mixed:
            mixed(args, overrides, cfg, progress)
        else:
            sizes = [tuple(int(v) for v in s.split("x")) for s in args.size] or list(cfg.warmup.sizes)
            if args.sweep or {"baseline", "optimised", "worker"} & set(wanted):
                for width, height in sizes:
                    measure_size(args, overrides, cfg, device, progress, wanted, width, height)
            if "ready" in wanted:
                with progress.phase("time to ready, cold and warm", args.phase_limit_s):
                    report["ready"] = phases.time_to_ready(args, overrides, args.out / "ready", progress)
                    r = report["ready"]
                    progress.say(f"time to ready: cold {r['cold_s']:.1f}s, warm {r['warm_s']:.1f}s "
                                 f"({r['warm_over_cold']:.2f}x; cache {r['cache_mb']} MB)")
    except Interrupted:
        progress.finish("interrupted")
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.finish("done" if not progress.failed else f"done, {progress.failed} phase(s) did not succeed")
    plotted = bool(report["sizes"]) and not args.mixed
    if plotted:
        plot(report, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.json'}" + (f" and {args.out / 'bench.png'}" if plotted else ""))
    return 0 if not progress.failed else 1


def saved_random_pipeline(arch: str, folder: Path, dtype: str) -> Path:
    """`arch` with random weights in `dtype`, saved to `folder` by save_pretrained unless a
    previous run saved it there (into a staging folder, then renamed: a folder that exists is
    whole): every phase then loads it with from_pretrained from local disk."""
    if (folder / "model_index.json").is_file():
        print(f"random weights ({arch}): loading the pipeline saved in {folder}", flush=True)
        return folder
    from diffusers.utils import logging as dlog

    from worker.model.architectures import build_pipeline

    dlog.disable_progress_bar()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the 12B transformer is built in minutes on a CPU
    pipe = build_pipeline(arch, dtype=getattr(torch, dtype), device=device)
    staging = folder.with_name(folder.name + ".partial")
    pipe.save_pretrained(staging)
    del pipe
    staging.rename(folder)  # whole or not at all
    print(f"random weights ({arch}): saved to {folder}", flush=True)
    return folder


def measure_size(args, overrides: list[str], cfg, device: torch.device, progress: Progress, wanted: list[str],
                 width: int, height: int) -> None:
    """The phases at one size, each under the time limit; figures land in the report as each ends."""
    size = f"{width}x{height}"
    jobs = phases.make_jobs(args.images, width, height, cfg.limits.default_steps)
    entry = progress.report["sizes"][size] = {}
    flops = transformer_flop(transformer_config(cfg), width, height, cfg.model.max_sequence_length,
                             cfg.limits.default_steps)
    entry["transformer_tflop_per_image"] = round(flops / 1e12, 4)
    run = {"baseline": lambda: phases.bare_baseline(cfg, jobs, device, progress),
           "optimised": lambda: phases.bare_optimised(cfg, jobs, device, progress,
                                                      args.out if args.profile else None),
           "worker": lambda: phases.full_worker(args, overrides, jobs, args.out / f"run-{size}", progress)}
    for name in ("baseline", "optimised", "worker"):
        if name in wanted:
            with progress.phase(f"{size} {name}", args.phase_limit_s):
                entry[name] = with_tflops(run[name](), flops)
                entry["ratios"] = ratios(entry)
                _print_phase(progress, name, entry[name])
    if args.sweep:
        entry["sweep"] = sweep(args, overrides, jobs, device, flops, progress, size)
    if entry.get("ratios"):
        progress.say(f"{size} ratios {entry['ratios']}")


MIXED_SIZES = [(256, 256), (384, 256), (512, 512)]


def mixed(args, overrides: list[str], cfg, progress: Progress) -> None:
    """The full worker on mixed traffic, 1 rank then N ranks, side by side in one run."""
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.size] or MIXED_SIZES
    jobs = phases.mixed_jobs(args.images, sizes, cfg.limits.default_steps)
    nproc = args.nproc if args.nproc > 1 else 2
    report = progress.report
    report.update(mixed=True, sizes=[f"{w}x{h}" for w, h in sizes], runs={})
    # Every size a request brings is warmed up, as a deployment would configure it.
    warm = [f"warmup.sizes={[list(s) for s in sizes]}"]
    for n in (1, nproc):
        with progress.phase(f"mixed, {n} rank(s)", args.phase_limit_s):
            run = phases.full_worker(args, overrides + warm, jobs, args.out / f"mixed-{n}", progress, nproc=n,
                                     idle_latency=False)
            report["runs"][str(n)] = run
            share = ", ".join(f"rank {r} {c / run['images']:.0%}" for r, c in enumerate(run["images_per_rank"]))
            progress.say(f"{n} rank(s): {run['images_per_min']:8.1f} images/min  p50 {run['latency_ms']['p50']:8.1f} ms"
                         f"  ({share})")
    if {"1", str(nproc)} <= set(report["runs"]):
        one, many = report["runs"]["1"]["images_per_min"], report["runs"][str(nproc)]["images_per_min"]
        report["ratio"] = round(many / one, 3)
        progress.say(f"{nproc} ranks / 1 rank: {report['ratio']:.2f}x on sizes {', '.join(report['sizes'])}")


def sweep(args, overrides: list[str], jobs: list, device: torch.device, flops: float, progress: Progress,
          size: str) -> list[dict]:
    """The optimised pipeline with each switch added to the ones before it (a label starting with a
    space is an alternative to the step before: measured, not kept)."""
    # From everything off, whatever the config file turns on; later overrides win.
    off = ["speed.compile=false", "speed.compile_vae=false", "speed.fuse_qkv=false", "speed.channels_last_vae=false",
           "speed.attention_backend=''", "speed.fp8=false", "speed.compile_scope=model", "batch.max_size=1"]
    rows, current = [], [o for o in overrides if not o.startswith(("speed.", "batch."))] + off
    progress.report["sizes"][size]["sweep"] = rows
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
            progress.say(f"sweep {label.strip()}: skipped ({e})")
            continue
        with progress.phase(f"{size} sweep: {label.strip()}", args.phase_limit_s) as record:
            row = with_tflops(phases.bare_optimised(cfg, jobs, device, progress), flops)
            rows.append({"step": label, "images_per_min": row["images_per_min"], "p50_ms": row["latency_ms"]["p50"],
                         "tflops": row["tflops"]})
            progress.say(f"sweep {label.strip():24s} {row['images_per_min']:8.1f} images/min")
        if record["status"] != "ok":
            rows.append({"step": label, "skipped": f"{record['status']}: {record.get('error', '')}"})
        elif not label.startswith(" "):
            current = trial
    return rows


def _describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def _print_phase(progress: Progress, name: str, e: dict) -> None:
    progress.say(f"{name:10s} {e['images_per_min']:8.1f} images/min  p50 {e['latency_ms']['p50']:8.1f} ms  "
                 f"p95 {e['latency_ms']['p95']:8.1f} ms  {e['tflops']:.4g} TFLOP/s  peak {e['peak_memory_mb']} MB")
