"""`python -m bench NAME [ARGS]`: one benchmark by name; without a name, the list.

Each benchmark parses its own arguments (`python -m bench NAME --help`) and writes its figures as
JSON where `--out` says; the make targets give each its usual place under var/bench.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module with main(argv), make target, what it measures)
BENCHMARKS = {
    "worker": ("bench.worker.cli", "bench, bench-mixed",
               "a plain diffusers loop vs the optimised engine vs the whole worker under torchrun"),
    "scheduler": ("bench.scheduler", "bench-scheduler", "the reference scheduler under simulated workers"),
    "fleet": ("bench.fleet", "bench-fleet", "one scheduler process under a fleet's load, its CPU per task"),
    "calls": ("bench.calls", "bench-calls", "each hot call's CPU in the scheduler"),
    "models": ("bench.models", "bench-models", "several models on a fleet: swaps with and without affinity"),
    "post": ("bench.post", "bench-post", "rank 0's post stage: image check, encode, store"),
    "lora": ("bench.lora", "bench-lora", "LoRA adapters: a round with 0/1/3, switches, compile, the cache's hit rate"),
    "latency": ("bench.latency", "bench-latency", "a task's latency from submit to result, by stage"),
    "policy": ("bench.policy", "bench-safety", "the prompt policy on the labelled sets, by language"),
    "safety": ("bench.safety", "bench-safety", "the embedded default's whole text and image checks"),
}


def usage() -> str:
    rows = [f"  {name:<10} {what} (make {target})" for name, (_, target, what) in BENCHMARKS.items()]
    return "usage: python -m bench NAME [ARGS]   (python -m bench NAME --help)\n\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"no benchmark named {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHMARKS[name][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
