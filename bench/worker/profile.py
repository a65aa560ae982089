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
