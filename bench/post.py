"""What rank 0's post stage costs, on photographs: `python -m bench post` (or `make bench-post`).

Random-weight models make noise-like images, which compress slowly and are not what users get; so
this measures photographs that ship in scikit-image's wheel (astronaut, coffee, rocket, chelsea,
hubble_deep_field), each scaled to cover and centre-cropped to every --size (default 1360x768 and
1024x1024), and noise apart as the worst case for lossless formats. Two parts, in one process:

  encoders   the worker's own encode_image for each format and setting a config can choose, one
             core (one torch thread; Pillow encodes on the calling thread): p50/p95 ms over every
             photograph, and median KB. The worker's default (the first of limits.output_formats,
             with EncodeConfig's defaults) is marked.
  post stage the worker's post stage (worker.serving.post: quality check, image check beside the
             encoder, store to a local directory) with the default format, on one photograph and
             on noise at the first size, with a pool of 1 thread and then --workers threads. The
             image check is the production one (a ViT-base/16 classifier, random weights: speed
             does not depend on them) on --device.

Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench.reports import save

PHOTOS = ("astronaut", "coffee", "rocket", "chelsea", "hubble_deep_field")
# (label, format, EncodeConfig fields): what a config can choose, fastest settings first.
CANDIDATES = [
    ("jpeg q95", "jpeg", {"jpeg_quality": 95}), ("jpeg q90", "jpeg", {"jpeg_quality": 90}),
    ("webp q90 m0", "webp", {"webp_quality": 90, "webp_method": 0}),
    ("webp q90 m4", "webp", {"webp_quality": 90, "webp_method": 4}),
    ("png level 1", "png", {"png_compress_level": 1}), ("png level 3", "png", {"png_compress_level": 3}),
    ("png level 6", "png", {"png_compress_level": 6}),
]


def photographs(width: int, height: int) -> dict[str, np.ndarray]:
    try:
        import skimage.data
    except ImportError:
        raise SystemExit("the post benchmark needs scikit-image for its photographs: pip install scikit-image "
                         "(in the project's `tools` extra)") from None
    return {name: cover(getattr(skimage.data, name)(), width, height) for name in PHOTOS}


def cover(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """Scaled to cover width x height, then centre-cropped: a photograph at the worker's size."""
    from PIL import Image

    img = Image.fromarray(pixels[..., :3])
    scale = max(width / img.width, height / img.height)
    img = img.resize((max(width, round(img.width * scale)), max(height, round(img.height * scale))), Image.LANCZOS)
    left, top = (img.width - width) // 2, (img.height - height) // 2
    return np.ascontiguousarray(np.asarray(img.crop((left, top, left + width, top + height))))


def noise(width: int, height: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def default_choice() -> tuple[str, dict]:
    """The worker's default output format and settings, as its config defines them."""
    from worker.config import EncodeConfig, LimitsConfig

    return LimitsConfig().output_formats[0], EncodeConfig().model_dump()


def encode_times(images: list[np.ndarray], fmt: str, settings: dict, repeats: int) -> dict:
    from worker.config import EncodeConfig
    from worker.storage.encode import encode_image

    cfg = EncodeConfig(**settings)
    ms, sizes = [], []
    for pixels in images:
        encode_image(pixels, fmt, cfg)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            data, _ = encode_image(pixels, fmt, cfg)
            ms.append((time.perf_counter() - t0) * 1e3)
        sizes.append(len(data))
    ms.sort()
    return {"p50_ms": round(statistics.median(ms), 1), "p95_ms": round(ms[round(0.95 * (len(ms) - 1))], 1),
            "kb_p50": round(statistics.median(sizes) / 1024)}


def encoder_rows(sizes: list[tuple[int, int]], repeats: int) -> list[dict]:
    fmt0, cfg0 = default_choice()
    rows = []
    for width, height in sizes:
        photos = list(photographs(width, height).values())
        worst = [noise(width, height)]
        for label, fmt, settings in CANDIDATES:
            rows.append({"size": f"{width}x{height}", "encoder": label, "format": fmt,
                         "default": fmt == fmt0 and all(cfg0[k] == v for k, v in settings.items()),
                         "photo": encode_times(photos, fmt, settings, repeats),
                         "noise": encode_times(worst, fmt, settings, repeats)})
    return rows


def measure(post, pixels: np.ndarray, n: int, width: int, height: int, fmt: str) -> dict:
    from protocol import Lease
    from worker.model.engine import Picture
    from worker.model.job import Job
    from worker.ranks.lockstep import Generated
    from worker.serving.ledger import Stage
    from worker.serving.task import Task

    tasks = []
    for i in range(n):
        task = Task(Lease(task_id=f"post-{time.monotonic_ns()}-{i}", input={}, created_at=0.0, lease_token="t",
                          lease_deadline=0.0, lease_ttl_s=60.0, attempt=1))
        task.job = Job(task_id=task.id, prompt="p", width=width, height=height, steps=4, seed=i, output_format=fmt)
        post.ledger.hold(task, Stage.GENERATE)
        tasks.append(task)
    t0 = time.perf_counter()
    results = [f.result() for f in [post.submit(t, Generated([Picture(pixels)], [])) for t in tasks]]
    seconds = time.perf_counter() - t0
    assert all(r is not None and hasattr(r, "uri") for r in results), results[:1]
    stages = {s: round(statistics.median(t.timings.as_dict()[s] for t in tasks), 1)
              for s in ("image_check", "encode", "store")}
    return {"images_per_s": round(n / seconds, 2), "stage_median_ms": stages, "bytes": results[0].bytes}


def post_rows(args, work: Path, width: int, height: int) -> list[dict]:
    from safety.config import HFClassifierConfig, ProfanityConfig, SafetyConfig
    from safety.guard import Guard
    from safety.image import HFImageCheck
    from safety.text import ProfanityCheck
    from bench.random_safety import make_vit_classifier
    from worker.config import EncodeConfig
    from worker.serving.ledger import Ledger
    from worker.serving.post import PostStage
    from worker.serving.state import WorkerState
    from worker.storage import LocalStore

    vit = HFImageCheck(HFClassifierConfig(model=str(make_vit_classifier(work / "vit", "base")), threshold=1.0),
                       args.device)
    guard = Guard(SafetyConfig(), ProfanityCheck(ProfanityConfig()), vit)
    store = LocalStore(work / "out")
    store.check_writable()  # creates the directory, as the worker does at start
    fmt = default_choice()[0]
    rows = []
    for kind, pixels in (("photo", photographs(width, height)["astronaut"]), ("noise", noise(width, height))):
        for workers in sorted({1, args.workers}):
            post = PostStage(guard, store, None, WorkerState(), Ledger(), EncodeConfig(), "bench", False, workers)
            measure(post, pixels, workers, width, height, fmt)  # warm-up
            row = measure(post, pixels, args.images, width, height, fmt)
            post.shutdown()
            row.update(image=kind, workers=workers, format=fmt,
                       images_per_s_per_core=round(row["images_per_s"] / workers, 2))
            rows.append(row)
    return rows


def print_report(report: dict, gpu_rates: list[float]) -> None:
    print(f"encoders, one core, photographs ({', '.join(PHOTOS)}) and noise; * the worker's default")
    print(f"{'size':>10} {'encoder':14} {'photo p50':>10} {'p95':>7} {'KB':>6} {'noise p50':>10} {'KB':>6}")
    for r in report["encoders"]:
        p, n = r["photo"], r["noise"]
        print(f"{r['size']:>10} {r['encoder'] + (' *' if r['default'] else ''):14} {p['p50_ms']:>10.1f} "
              f"{p['p95_ms']:>7.1f} {p['kb_p50']:>6} {n['p50_ms']:>10.1f} {n['kb_p50']:>6}")
    print(f"\npost stage at {report['size']} ({report['post'][0]['format']}), image check on {report['device']}, "
          f"{report['images']} images per run")
    print(f"{'image':6} {'threads':>7} {'images/s':>9} {'per core':>9} {'check ms':>9} {'encode ms':>10} "
          f"{'store ms':>9} {'KB':>6}")
    for r in report["post"]:
        s = r["stage_median_ms"]
        print(f"{r['image']:6} {r['workers']:>7} {r['images_per_s']:>9.2f} {r['images_per_s_per_core']:>9.2f} "
              f"{s['image_check']:>9.1f} {s['encode']:>10.1f} {s['store']:>9.1f} {r['bytes'] // 1024:>6}")
    per_core = min(r["images_per_s_per_core"] for r in report["post"] if r["image"] == "photo")
    for rate in gpu_rates or [1.0, 2.5, 4.0]:
        print(f"at {rate:g} images/s per GPU, one rank-0 core feeds {per_core / rate:.2f} GPU(s); "
              f"8 GPUs need {8 * rate / per_core:.1f} cores")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench post", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", action="append", default=[], metavar="WxH",
                   help="repeatable; default 1360x768 and 1024x1024; the post stage runs at the first")
    p.add_argument("--repeats", type=int, default=5, help="timed encodes per photograph and encoder")
    p.add_argument("--images", type=int, default=24, help="images per post-stage run")
    p.add_argument("--workers", type=int, default=2, help="pool threads of the second run (one core each)")
    p.add_argument("--device", default="cpu", help="where the image check runs (cpu, cuda)")
    p.add_argument("--gpu-rate", type=float, action="append", default=[],
                   help="images/s one GPU makes (repeatable); default 1.0, 2.5 and 4.0")
    p.add_argument("--out", default="var/bench/post.json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # one core per pool thread: the figures are per core
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.size] or [(1360, 768), (1024, 1024)]
    report = {"size": "x".join(map(str, sizes[0])), "device": args.device, "images": args.images,
              "machine": platform.processor() or platform.machine(), "encoders": encoder_rows(sizes, args.repeats)}
    with tempfile.TemporaryDirectory() as work:
        report["post"] = post_rows(args, Path(work), *sizes[0])
    out = Path(args.out)
    print_report(report, args.gpu_rate)
    save(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
