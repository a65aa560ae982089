"""`python -m bench worker --profile`: torch.profiler on the optimised engine once it is warm, for one
denoising step and for one whole image (text encoders, every step, the VAE).

The step is cut out of a normal generation by the profiler's schedule, stepped from the engine's
per-step callback: the first step is the profiler's warm-up, the second is recorded. No hook is added to the
transformer, since a compiled module with a new hook would be compiled again.

Each profile writes a Chrome trace (`.json.gz`: Perfetto or chrome://tracing opens it) and a
per-operator table (`.txt`, by self time on the device on a GPU, on the CPU otherwise); the top
operators also go into bench.json.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from worker.model.engine import Engine
from worker.model.job import Job

TOP = 15  # operators per profile in bench.json; the .txt holds more


def profile_engine(engine: Engine, job: Job, out: Path, label: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    if job.steps < 2:
        raise ValueError("profiling one step needs a job of at least 2 steps (the first is skipped)")
    return {"step": _step(engine, job, out / f"profile-{label}-step"),
            "image": _image(engine, job, out / f"profile-{label}-image")}


def _step(engine: Engine, job: Job, stem: Path) -> dict:
    done: list[profile] = []
    # Step 0 (which also holds the text encoders) is the profiler's warm-up, discarded; step 1 is recorded.
    with _profiler(engine.device, schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                   on_trace_ready=done.append) as prof:
        engine.generate_batch([job], on_step=lambda _i: prof.step())
    if not done:
        raise RuntimeError("the profiler recorded no step")
    return _write(done[0], engine.device, stem)


def _image(engine: Engine, job: Job, stem: Path) -> dict:
    with _profiler(engine.device) as prof:
        engine.generate(job)
    return _write(prof, engine.device, stem)


def _profiler(device: torch.device, **kw) -> profile:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities, record_shapes=True, **kw)


def _write(prof: profile, device: torch.device, stem: Path) -> dict:
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    trace, table = stem.with_suffix(".json.gz"), stem.with_suffix(".txt")
    prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    table.write_text(events.table(sort_by=key, row_limit=60) + "\n")
    total = sum(getattr(e, key) for e in events) or 1.0
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:TOP]
    return {"sorted_by": key, "trace": trace.name, "table": table.name, "self_ms_total": round(total / 1e3, 3),
            "top": [{"op": e.key, "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 3),
                     "share": round(getattr(e, key) / total, 4)} for e in top]}


def summarize_trace(path: Path, top: int = 8) -> dict:
    """Where the time of a Chrome trace from the worker's profiler (worker.serving.profiling) went:
    the window it covers, how much of it the GPU was busy (the union of kernels, copies and sets on
    every stream), each stream's kernels, the GPU's idle gaps, and each thread's time inside
    operators (the union of its operator intervals: nested operators count once)."""
    import gzip
    import json

    events = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if not spans:
        return {"window_ms": 0.0}
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    names = {e["tid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name" and "args" in e}
    device = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    busy = _union(device)
    gaps = sorted((b - a for a, b in _gaps(device, start, end)), reverse=True)
    streams: dict[str, list[dict]] = {}
    for e in device:
        streams.setdefault(str(e.get("args", {}).get("stream", e.get("tid"))), []).append(e)
    threads: dict[str, list[dict]] = {}
    for e in spans:
        if e.get("cat") == "cpu_op":
            threads.setdefault(str(e["tid"]), []).append(e)
    window = (end - start) / 1e3
    return {
        "window_ms": round(window, 1),
        "gpu_busy_ms": round(busy / 1e3, 1),
        "gpu_busy_share": round(busy / 1e3 / window, 4) if window else 0.0,
        "gpu_idle_gaps": {"over_1ms": sum(g > 1e3 for g in gaps),
                          "over_1ms_total_ms": round(sum(g for g in gaps if g > 1e3) / 1e3, 1),
                          "largest_ms": [round(g / 1e3, 2) for g in gaps[:top]]},
        "streams": {s: {"kernels": len(es), "busy_ms": round(_union(es) / 1e3, 1), "top": _top(es, top)}
                    for s, es in sorted(streams.items(), key=lambda kv: -len(kv[1]))},
        "threads": {names.get(_tid(tid)) or tid: {"ops": len(es), "busy_ms": round(_union(es) / 1e3, 1),
                                                  "top": _top(es, top)}
                    for tid, es in sorted(threads.items(), key=lambda kv: -_union(kv[1]))},
    }


def _tid(tid: str):
    return int(tid) if tid.lstrip("-").isdigit() else tid


def _union(spans: list[dict]) -> float:
    """Microseconds covered by at least one span."""
    total, reach = 0.0, float("-inf")
    for e in sorted(spans, key=lambda e: e["ts"]):
        a, b = e["ts"], e["ts"] + e["dur"]
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def _gaps(spans: list[dict], start: float, end: float) -> list[tuple[float, float]]:
    """The stretches of [start, end] that no span covers."""
    out, reach = [], start
    for e in sorted(spans, key=lambda e: e["ts"]):
        if e["ts"] > reach:
            out.append((reach, e["ts"]))
        reach = max(reach, e["ts"] + e["dur"])
    if end > reach:
        out.append((reach, end))
    return out


def _top(spans: list[dict], n: int) -> list[dict]:
    by: dict[str, list[float]] = {}
    for e in spans:
        by.setdefault(e["name"][:120], []).append(e["dur"])
    ranked = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": k, "calls": len(v), "ms": round(sum(v) / 1e3, 2)} for k, v in ranked]
