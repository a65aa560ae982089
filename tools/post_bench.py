"""What rank 0's post stage can carry: `python -m tools.post_bench` (or `make bench-post`).

Runs the worker's own post stage (worker.serving.post: quality check, image check, encode, store to
a local directory) on N images of one size, with a pool of 1 thread and then of `--workers` threads,
one torch thread each, side by side in one process. Prints images/s, images/s per core and the
median time of each stage, and how many GPUs that feeds at a given GPU rate. The image check is
the production one (a ViT-base/16 classifier, random weights: speed does not depend on them) on
`--device`; the images are synthetic: `photo` (smooth structure with fine grain, which compresses
like a photograph) and `noise` (the worst case for PNG). Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Low-frequency structure at a few scales plus grain: PNG sizes like a photograph's."""
    rng = np.random.default_rng(seed)
    out = np.zeros((height, width, 3))
    for cells, amp in ((4, 90), (16, 40), (64, 15)):
        coarse = rng.uniform(-1, 1, (cells * height // width + 2, cells + 2, 3))
        ys, xs = np.linspace(0, coarse.shape[0] - 1.001, height), np.linspace(0, coarse.shape[1] - 1.001, width)
        y0, x0 = ys.astype(int), xs.astype(int)
        fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
        c = coarse
        out += amp * ((c[y0][:, x0] * (1 - fx) + c[y0][:, x0 + 1] * fx) * (1 - fy)
                      + (c[y0 + 1][:, x0] * (1 - fx) + c[y0 + 1][:, x0 + 1] * fx) * fy)
    return np.clip(128 + out + rng.normal(0, 3, out.shape), 0, 255).astype(np.uint8)


def noise(width: int, height: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def measure(post, pixels: np.ndarray, n: int, width: int, height: int) -> dict:
    from protocol import Lease
    from worker.model.engine import Picture
    from worker.model.job import Job
    from worker.ranks.lockstep import Outcome
    from worker.serving.task import Task

    tasks = []
    for i in range(n):
        task = Task(Lease(task_id=f"post-{time.monotonic_ns()}-{i}", input={}, created_at=0.0, lease_token="t",
                          lease_deadline=0.0, lease_ttl_s=60.0, attempt=1))
        task.job = Job(task_id=task.id, prompt="p", width=width, height=height, steps=4, seed=i, output_format="png")
        tasks.append(task)
    t0 = time.perf_counter()
    results = [f.result() for f in [post.submit(t, Outcome(Picture(pixels), [])) for t in tasks]]
    seconds = time.perf_counter() - t0
    assert all(r is not None and hasattr(r, "uri") for r in results), results[:1]
    stages = {s: round(statistics.median(t.timings.as_dict()[s] for t in tasks), 1)
              for s in ("image_check", "encode", "store")}
    return {"images_per_s": round(n / seconds, 2), "stage_median_ms": stages, "png_bytes": results[0].bytes}


def run(args, work: Path) -> dict:
    import torch

    from safety.config import HFClassifierConfig, ProfanityConfig, SafetyConfig
    from safety.guard import Guard
    from safety.image import HFImageCheck
    from safety.text import ProfanityCheck
    from tools.random_safety import make_vit_classifier
    from worker.config import EncodeConfig
    from worker.serving.ledger import Ledger
    from worker.serving.post import PostStage
    from worker.serving.state import WorkerState
    from worker.storage import LocalStore

    torch.set_num_threads(1)  # one core per pool thread: the figure is per core
    vit = HFImageCheck(HFClassifierConfig(model=str(make_vit_classifier(work / "vit", "base")), threshold=1.0),
                       args.device)
    guard = Guard(SafetyConfig(), ProfanityCheck(ProfanityConfig()), vit)
    width, height = (int(v) for v in args.size.split("x"))
    store = LocalStore(work / "out")
    store.check_writable()  # creates the directory, as the worker does at start
    rows = []
    for kind, make in (("photo", photo), ("noise", noise)):
        pixels = make(width, height)
        for workers in sorted({1, args.workers}):
            post = PostStage(guard, store, None, WorkerState(), Ledger(), EncodeConfig(), "bench", False,
                             workers)
            measure(post, pixels, workers, width, height)  # warm-up
            row = measure(post, pixels, args.images, width, height)
            post.shutdown()
            row.update(image=kind, workers=workers, images_per_s_per_core=round(row["images_per_s"] / workers, 2))
            rows.append(row)
    return {"size": args.size, "device": args.device, "machine": platform.processor() or platform.machine(),
            "images": args.images, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1360x768")
    p.add_argument("--images", type=int, default=40)
    p.add_argument("--workers", type=int, default=2, help="pool threads of the second run (one core each)")
    p.add_argument("--device", default="cpu", help="where the image check runs (cpu, cuda)")
    p.add_argument("--gpu-rate", type=float, action="append", default=[],
                   help="images/s one GPU makes (repeatable); default 1.0, 2.5 and 4.0")
    p.add_argument("--out", default="var/bench/post.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        report = run(args, Path(work))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"post stage at {report['size']}, image check on {args.device}, {report['images']} images per run")
    print(f"{'image':6} {'threads':>7} {'images/s':>9} {'per core':>9} {'check ms':>9} {'encode ms':>10} "
          f"{'store ms':>9} {'PNG KB':>7}")
    for r in report["rows"]:
        s = r["stage_median_ms"]
        print(f"{r['image']:6} {r['workers']:>7} {r['images_per_s']:>9.2f} {r['images_per_s_per_core']:>9.2f} "
              f"{s['image_check']:>9.1f} {s['encode']:>10.1f} {s['store']:>9.1f} {r['png_bytes'] // 1024:>7}")
    per_core = min(r["images_per_s_per_core"] for r in report["rows"] if r["image"] == "photo")
    for rate in args.gpu_rate or [1.0, 2.5, 4.0]:
        print(f"at {rate:g} images/s per GPU, one rank-0 core feeds {per_core / rate:.2f} GPU(s); "
              f"8 GPUs need {8 * rate / per_core:.1f} cores")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
