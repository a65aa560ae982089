"""What the worker adds to one request: `python -m bench latency` (or `make bench-latency`).

Starts the reference scheduler (SQLite) and a 1-rank worker under torchrun (configs/tiny.toml
unless --config), waits until it is ready, then sends --requests tasks one at a time, each as
`POST /v1/tasks` with `Prefer: wait`, and times submit -> response at the client. The idle worker
is long-polling for a lease when each one arrives, as it would be at night.

  overhead = response time - the generate stage (the lockstep round: prompt embedding, denoising,
             VAE decode, gathering the image), from the task's own `timings_ms`.

The overhead is split into the worker's stages (their medians from `timings_ms`: text check,
`processing` report, wait for a round, broadcast, the image check and the encoder, which run side
by side and count as the longer of the two, store) and the rest, read from the scheduler's clock:
submit -> lease (the submit call, the long poll waking, validation), the result's hand-off and
report, and the client's wait waking on it. `settle` (the serve loop's wait for room in the post
stage) is left out: on an idle worker it happens before the task arrives. Prints p50/p95 of the
overhead and each part's share; writes JSON to --out. Warm-up requests (not counted) go first.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from launch.local import free_port, start_scheduler, start_worker, wait_until
from bench.worker.phases import PROMPTS
from bench.reports import save

# The worker's stages on an idle request's path besides generation, in order; the image check and
# the encoder overlap (worker.serving.post).
STAGES = ("text_check", "admit", "wait", "broadcast", "image_check", "encode", "store")
OVERLAPPED = "image check | encode"


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def one_request(http: httpx.Client, i: int, width: int, height: int, fmt: str | None) -> dict:
    """One task submitted with Prefer: wait; the client's clock and the task as answered."""
    body = {"input": {"prompt": f"{PROMPTS[i % len(PROMPTS)]}, take {i}", "width": width, "height": height,
                      "seed": i}}
    if fmt:
        body["input"]["output_format"] = fmt
    sent = time.time()
    t0 = time.perf_counter()
    resp = http.post("/v1/tasks", json=body, headers={"Prefer": "wait=120"})
    ms = (time.perf_counter() - t0) * 1e3
    received = time.time()
    resp.raise_for_status()
    task = resp.json()
    if task["status"] != "succeeded":
        raise RuntimeError(f"request {i} ended {task['status']}: {task.get('error')}")
    return {"sent": sent, "received": received, "response_ms": ms, "task": task}


def parts(sample: dict) -> dict[str, float]:
    """One request's overhead, split: the worker's stages and what the clocks say of the rest."""
    task, timings = sample["task"], sample["task"]["result"]["timings_ms"]
    stage = {s: timings.get(s, 0.0) for s in STAGES}
    started, finished = task["started_at"], task["finished_at"]
    out = {"submit -> lease": max(0.0, (started - sample["sent"]) * 1e3 - stage["text_check"] - stage["admit"]),
           "text_check": stage["text_check"], "admit": stage["admit"], "wait": stage["wait"],
           "broadcast": stage["broadcast"], OVERLAPPED: max(stage["image_check"], stage["encode"]),
           "store": stage["store"]}
    # processing -> finished (scheduler's clock) holds the later stages, the hand-off and the report.
    later = sum(out[k] for k in ("wait", "broadcast", OVERLAPPED, "store")) + timings["generate"]
    out["hand-off and report"] = max(0.0, (finished - started) * 1e3 - later)
    out["result -> response"] = max(0.0, (sample["received"] - finished) * 1e3)
    return out


def summarise(samples: list[dict]) -> dict:
    overhead = [s["response_ms"] - s["task"]["result"]["timings_ms"]["generate"] for s in samples]
    split = [parts(s) for s in samples]
    medians = {k: statistics.median(p[k] for p in split) for k in split[0]}
    total = sum(medians.values()) or 1.0
    return {
        "requests": len(samples),
        "response_ms": {"p50": round(percentile([s["response_ms"] for s in samples], 0.5), 1),
                        "p95": round(percentile([s["response_ms"] for s in samples], 0.95), 1)},
        "generate_ms_p50": round(statistics.median(s["task"]["result"]["timings_ms"]["generate"]
                                                   for s in samples), 1),
        "overhead_ms": {"p50": round(percentile(overhead, 0.5), 1), "p95": round(percentile(overhead, 0.95), 1),
                        "max": round(max(overhead), 1)},
        "parts_ms_p50": {k: round(v, 1) for k, v in medians.items()},
        "overlapped_ms_p50": {s: round(statistics.median(x["task"]["result"]["timings_ms"].get(s, 0.0)
                                                         for x in samples), 1) for s in ("image_check", "encode")},
        "parts_share": {k: round(v / total, 3) for k, v in medians.items()},
        "bytes_p50": statistics.median(s["task"]["result"]["bytes"] for s in samples),
        "content_type": samples[0]["task"]["result"]["content_type"],
    }


def model_overrides(args: argparse.Namespace, work: Path) -> list[str]:
    """--random-weights: the full-size architecture and base-size safety models, random weights
    (speed does not depend on the values); else --model as model.source, if given."""
    if args.random_weights:
        from bench.random_safety import bench_overrides

        return [f"model.random_arch={args.random_weights}", *bench_overrides(work / "models")]
    return ["model.source=" + str(Path(args.model).resolve())] if args.model else []


def run(args: argparse.Namespace, work: Path) -> dict:
    width, height = (int(v) for v in args.size.split("x"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scheduler = start_scheduler(work / "scheduler.db", port, work / "scheduler.log")
    worker = None
    try:
        worker = start_worker(Path(args.config).resolve(), 1, work / "worker.log", overrides=[
            f"queue.url={url}", "storage.kind=local", f"storage.local.root={work / 'images'}", "ops.port=0",
            f"warmup.sizes=[[{width}, {height}]]", *model_overrides(args, work), *args.set])
        with httpx.Client(base_url=url, timeout=150.0) as http:
            wait_until(lambda: [w for w in http.get("/v1/workers").json() if w["status"] == "ready"],
                       args.ready_timeout, "the worker to be ready", proc=worker)
            for i in range(args.warmup):
                one_request(http, 1000 + i, width, height, args.format)
            samples = [one_request(http, i, width, height, args.format) for i in range(args.requests)]
    except Exception:
        if worker is not None:
            print(worker.messages()[-3000:])
        raise
    finally:
        if worker is not None:
            worker.stop(timeout=60)
        scheduler.stop()
    return {"config": args.config, "random_weights": args.random_weights, "size": args.size,
            "format": args.format or "the config's default",
            "machine": platform.processor() or platform.machine(), "set": args.set, **summarise(samples)}


def print_report(report: dict) -> None:
    print(f"one request at a time on an idle worker ({report['config']}, {report['size']}, "
          f"{report['content_type']}, {report['requests']} requests)")
    r, o = report["response_ms"], report["overhead_ms"]
    print(f"submit -> response  p50 {r['p50']:7.1f} ms  p95 {r['p95']:7.1f} ms "
          f"(generate stage p50 {report['generate_ms_p50']:.1f} ms)")
    print(f"overhead            p50 {o['p50']:7.1f} ms  p95 {o['p95']:7.1f} ms  max {o['max']:.1f} ms")
    print(f"{'part of the overhead':24} {'p50 ms':>8} {'share':>7}")
    for name, ms in report["parts_ms_p50"].items():
        print(f"{name:24} {ms:8.1f} {100 * report['parts_share'][name]:6.1f}%")
    side = report["overlapped_ms_p50"]
    print(f"(side by side: image check {side['image_check']:.1f} ms, encode {side['encode']:.1f} ms)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench latency", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/tiny.toml")
    p.add_argument("--model", default="models/tiny-flux", help="model.source; empty: the config's")
    p.add_argument("--random-weights", nargs="?", const="flux.1-schnell", default=None, metavar="ARCH",
                   help="build ARCH (default flux.1-schnell) and base-size safety models with random weights; "
                        "--model is ignored")
    p.add_argument("--size", default="1360x768")
    p.add_argument("--format", default=None, help="output_format; default: the config's default")
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--set", action="append", default=[], help="a worker config override (repeatable)")
    p.add_argument("--out", default="var/bench/latency.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        report = run(args, Path(work))
    out = Path(args.out)
    print_report(report)
    save(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
