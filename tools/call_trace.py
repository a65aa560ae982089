"""Which calls cross a module boundary while rank 0 serves tasks: how many modules take part in a
task's path (lease -> admit -> broadcast -> generate -> check -> store -> report) and how often they
call each other. A measure of coupling for refactors, taken from a real run, not the source.

    python -m tools.call_trace [--tasks 8] [--out var/call_trace.json]

Starts the reference scheduler and a 1-rank worker on the tiny model (configs/tiny.toml; the model
is built in models/tiny-flux if absent), with the rank running under a profiler, submits `--tasks`
tasks, waits for them, drains the worker and prints:

- modules: the product modules rank 0 entered once the serve loop began;
- edges: distinct (caller function -> callee function) pairs whose modules differ, where one side is
  in worker.serving (the rank-0 package); and the distinct module pairs among them;
- calls per task: how many such calls happened, divided by the tasks served.

Edges are counted from the start of `Coordinator.serve`: start-up (build, load, register) is left out.
The heartbeat and watchdog threads are included (they renew and police each task's lease), so the
per-task figure varies a little with timing; the edge counts do not.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import runpy
import shutil
import sys
import tempfile
import threading
from pathlib import Path

PRODUCT = ("worker.", "safety.", "protocol.", "telemetry.")
RANK0 = "worker.serving."
SERVE = ("worker.serving.coordinator", "serve")


class Tracer:
    """A profile hook on every thread: counts calls whose caller and callee are product functions
    in different modules, one side in the rank-0 package. Off until the serve loop starts."""

    def __init__(self) -> None:
        self.on = False
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.modules: set[str] = set()

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not self.on:
            self.on = (callee, frame.f_code.co_name) == SERVE
            return
        if not callee.startswith(PRODUCT):
            return
        self.modules.add(callee)
        back = frame.f_back
        caller = back.f_globals.get("__name__", "") if back is not None else ""
        if caller == callee or not caller.startswith(PRODUCT):
            return
        if caller.startswith(RANK0) or callee.startswith(RANK0):
            self.calls[(f"{caller}:{back.f_code.co_name}", f"{callee}:{frame.f_code.co_name}")] += 1

    def dump(self, path: str) -> None:
        edges = sorted(self.calls.items(), key=lambda kv: -kv[1])
        with open(path, "w") as f:
            json.dump({"modules": sorted(self.modules),
                       "edges": [{"caller": a, "callee": b, "calls": n} for (a, b), n in edges]}, f, indent=1)


def rank_main(out: str, argv: list[str]) -> None:
    """Inside the rank: trace, then run the worker as `python -m worker ARGV` would."""
    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    atexit.register(tracer.dump, out)
    sys.argv = ["worker", *argv]
    try:
        runpy.run_module("worker", run_name="__main__", alter_sys=True)
    finally:
        sys.setprofile(None)
        tracer.dump(out)


def summary(trace: dict, tasks: int) -> dict:
    edges = trace["edges"]
    pairs = {(e["caller"].split(":")[0], e["callee"].split(":")[0]) for e in edges}
    rank0 = sorted(m for m in trace["modules"] if m.startswith(RANK0))
    return {"tasks": tasks, "rank0_modules_entered": len(rank0), "product_modules_entered": len(trace["modules"]),
            "function_edges": len(edges), "module_pairs": len(pairs),
            "calls_per_task": round(sum(e["calls"] for e in edges) / max(tasks, 1), 1)}


def drain(torchrun) -> int:
    """SIGTERM to the rank, as node.sh's drain does, so it finishes and exits 0 (torchrun itself
    raises on a SIGTERM of its own)."""
    import psutil

    for rank in psutil.Process(torchrun.pid).children():
        rank.terminate()
    return torchrun.wait(60)


def drive(args: argparse.Namespace) -> dict:
    from launch.local import Client, Proc, free_port, start_scheduler, wait_until

    model = Path("models/tiny-flux")
    if not (model / "model_index.json").exists():
        from tools.tiny_model import make_tiny_model
        make_tiny_model(model)
    work = Path(tempfile.mkdtemp(prefix="call-trace-"))
    port = free_port()
    scheduler = start_scheduler(work / "db.sqlite", port, work / "scheduler.log")
    trace_file = work / "trace.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "--max-restarts=0",
           "-m", "tools.call_trace", "--rank", str(trace_file), "--", "--config", "configs/tiny.toml",
           "--set", f"queue.url=http://127.0.0.1:{port}", "--set", f"storage.local.root={work / 'out'}",
           "--set", "ops.enabled=false"]
    worker = Proc(cmd, work / "worker.log", env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    try:
        client = Client(f"http://127.0.0.1:{port}")
        ids = [client.submit({"prompt": f"a lighthouse, number {i}", "width": 256, "height": 256})["id"]
               for i in range(args.tasks)]
        done = client.wait(ids, timeout=300, proc=worker)
        bad = {t: v["status"] for t, v in done.items() if v["status"] != "succeeded"}
        if bad:
            raise SystemExit(f"tasks did not succeed: {bad}; see {work}")
        rc = drain(worker)
        wait_until(trace_file.exists, 10, "the trace file")
    finally:
        if worker.alive():
            worker.kill()
        scheduler.stop()
    trace = json.loads(trace_file.read_text())
    shutil.rmtree(work, ignore_errors=True)
    return {"worker_exit": rc, **summary(trace, args.tasks), "trace": trace}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank"]:  # the rank process that torchrun started
        sep = argv.index("--")
        rank_main(argv[1], argv[sep + 1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("var/call_trace.json"))
    args = p.parse_args(argv)
    result = drive(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "trace"}, indent=1))
    pairs = collections.Counter()
    for e in result["trace"]["edges"]:
        pairs[(e["caller"].split(":")[0], e["callee"].split(":")[0])] += e["calls"]
    for (a, b), n in sorted(pairs.items()):
        print(f"  {a} -> {b}: {n} calls")
    print(f"full trace: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
