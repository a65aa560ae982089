"""What LoRA adapters cost: `python -m bench lora` (or `make bench-lora`).

On the tiny FLUX model (CPU by default; `--model DIR --device cuda` for another), random adapters of
rank 64 on every attention and feed-forward layer, built with peft at start. Four parts, one process:

  round      a round's time (batch 1) with 0, 1 and 3 adapters, each way a pipeline can hold them:
             none loaded (the plain engine); unfused by name (worker.model.adapters.Adapters, the
             worker's way without compile); fused into the weights (diffusers' fuse_lora); the
             compiled mode's fixed slots (Slots), here eager. Median over --rounds.
  switch     what a change of set costs on each: the first load of a file, a change among held
             adapters, a change of scale; fused: unfuse, then fuse the new set.
  compile    (--compile) Inductor, as speed.compile: the slots' first round (the compile), then
             switches between sets, their time and the graphs compiled (dynamo's count); beside
             it, adapters by name on a compiled transformer, which recompile on a switch.
  cache      the node's disk cache (worker.adapters.AdapterCache) and each pipeline's held set
             under a mixed load: --tasks tasks drawing 0-3 of --files adapters by a Zipf law; per
             cache budget, the hit rate and the bytes fetched; per holder, the loads per task.

  full size  arithmetic, not a timing: what slots add to the full-size FLUX.1 transformer's linear
             layers (built on the meta device, no weights), per slot and rank: parameters, their
             bytes in bf16, and the share of the linear layers' multiply-adds.

Writes JSON to --out and prints each part as it ends.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.reports import save

TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
           "ff.net.0.proj", "ff.net.2", "proj_mlp", "proj_out")
SIZE = (128, 128)


def adapters(model: Path, out: Path, n: int, rank: int) -> list:
    from launch.tiny_model import make_tiny_lora
    from worker.model.adapters import Wanted

    made = []
    for i in range(n):
        path = make_tiny_lora(model, out / f"a{i}.safetensors", rank=rank, seed=100 + i, targets=TARGETS)
        made.append(Wanted(hashlib.sha256(path.read_bytes()).hexdigest(), path, 1.0))
    return made


def engine(model: Path, device: str, compile_: bool = False, slots: int = 0, rank: int = 64):
    import torch

    from worker.config import LoraConfig, ModelConfig, SpeedConfig
    from worker.model.engine import Engine

    cfg = ModelConfig(name="tiny", source=str(model), dtype="float32", device=device, max_sequence_length=64)
    lora = LoraConfig(allow=("https://bench.invalid/",), max_adapters=slots, max_rank=rank) if slots else None
    return Engine.load(cfg, torch.device(device), SpeedConfig(compile=compile_), lora=lora)


def job(seed: int = 0, steps: int = 4):
    from worker.model.job import Job

    return Job(task_id=f"b{seed}", prompt="a lighthouse at dusk, watercolour", width=SIZE[0], height=SIZE[1],
               steps=steps, seed=seed, output_format="png")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def median_round(eng, rounds: int) -> float:
    eng.generate(job())  # warm
    return statistics.median(timed(lambda: eng.generate(job())) for _ in range(rounds))


def sets(files, n: int) -> list:
    from worker.model.adapters import Wanted

    return [Wanted(f.sha256, f.path, 0.8) for f in files[:n]]


def part_round(model: Path, device: str, files, rounds: int) -> dict:
    from worker.model.adapters import Slots

    plain = engine(model, device)
    rows = {"plain (no adapter loaded)": {"0": median_round(plain, rounds)}}
    named = {}
    for n in (0, 1, 3):
        plain.adapters.use(sets(files, n) if n else [])
        if n == 0:
            plain.adapters.use(sets(files, 3))  # held, then off: what a worker that has served adapters runs
            plain.adapters.use([])
        named[str(n)] = median_round(plain, rounds)
    rows["unfused, by name"] = named
    fused = {"0": named["0"]}
    for n in (1, 3):
        plain.adapters.use(sets(files, n))
        plain.pipe.fuse_lora(adapter_names=[f.name for f in sets(files, n)])
        fused[str(n)] = median_round(plain, rounds)
        plain.pipe.unfuse_lora()
    plain.adapters.clear()
    rows["fused into the weights"] = fused
    slotted = engine(model, device)
    slots = Slots(slotted.pipe, 3, 64)
    slots.prepare()
    rows["3 slots of rank 64 (eager)"] = {str(n): (slots.use(sets(files, n)), median_round(slotted, rounds))[1]
                                         for n in (0, 1, 3)}
    base = rows["plain (no adapter loaded)"]["0"]
    return {"ms": rows, "vs_plain": {k: {n: round(v / base, 3) for n, v in r.items()} for k, r in rows.items()}}


def part_switch(model: Path, device: str, files, repeats: int = 5) -> dict:
    from worker.model.adapters import Adapters, Slots, Wanted

    def scaled(ws, s):
        return [Wanted(w.sha256, w.path, s) for w in ws]

    out = {}
    a = engine(model, device)
    named = Adapters(a.pipe)
    first = timed(lambda: named.use(sets(files, 3)))
    named.use(sets(files[3:], 3))
    among = statistics.median(timed(lambda: named.use(sets(files, 3) if i % 2 else sets(files[3:], 3)))
                              for i in range(repeats))
    scale = statistics.median(timed(lambda: named.use(scaled(sets(files, 3), 0.5 + i / 10))) for i in range(repeats))
    out["unfused, by name"] = {"first load of 3": first, "between held sets of 3": among, "scale change": scale}

    def refuse(ws):
        a.pipe.unfuse_lora()
        named.use(ws)
        a.pipe.fuse_lora(adapter_names=[w.name for w in ws])

    a.pipe.fuse_lora(adapter_names=[w.name for w in sets(files, 3)])
    out["fused into the weights"] = {"between held sets of 3 (unfuse, fuse)": statistics.median(
        timed(lambda: refuse(sets(files, 3) if i % 2 else sets(files[3:], 3))) for i in range(repeats))}
    a.pipe.unfuse_lora()
    b = engine(model, device)
    slots = Slots(b.pipe, 3, 64)
    slots.prepare()
    first = timed(lambda: slots.use(sets(files, 3)))
    loads = statistics.median(timed(lambda: slots.use(sets(files, 3) if i % 2 else sets(files[3:], 3)))
                              for i in range(repeats))
    scale = statistics.median(timed(lambda: slots.use(scaled(sets(files[3:], 3), 0.5 + i / 10)))
                              for i in range(repeats))
    out["3 slots"] = {"first load of 3": first, "a new set of 3 (copied in)": loads, "scale change": scale}
    return {"ms": out}


def part_compile(model: Path, device: str, files) -> dict:
    import torch
    from torch._dynamo.utils import counters

    from worker.model.adapters import Adapters

    def graphs() -> int:
        return counters["stats"]["unique_graphs"]

    out = {}
    for label, slotted in (("3 slots, compiled", True), ("by name, compiled", False)):
        torch._dynamo.reset()
        eng = engine(model, device, compile_=True, slots=3 if slotted else 0)
        holder = eng.adapters if slotted else Adapters(eng.pipe)
        before = graphs()
        first = timed(lambda: eng.generate(job()))
        row = {"first round (compile) ms": first, "graphs": graphs() - before, "switches": []}
        for n, start in ((1, 0), (3, 0), (3, 3), (0, 0)):
            g = graphs()
            ms = timed(lambda: (holder.use(sets(files[start:], n) if n else []), eng.generate(job())))
            row["switches"].append({"to": f"{n} adapters" + (f" (files {start}..)" if n else ""),
                                    "round ms": ms, "graphs compiled": graphs() - g})
        out[label] = row
        print(label, row, flush=True)
    torch._dynamo.reset()
    return out


def part_cache(model: Path, files, tasks: int, budgets: tuple[int, ...], seed: int = 0) -> dict:
    from worker.adapters import AdapterCache, Source
    from worker.config import LoraConfig
    from worker.model.adapters import Adapters, Slots, Wanted

    rng = random.Random(seed)
    weights = [1 / (k + 1) ** 1.1 for k in range(len(files))]
    stream = []
    for _ in range(tasks):
        n = rng.choices((0, 1, 2, 3), (0.4, 0.35, 0.15, 0.1))[0]
        picked = set()
        while len(picked) < n:
            picked.add(rng.choices(range(len(files)), weights)[0])
        stream.append(sorted(picked))
    size = {i: f.path.stat().st_size for i, f in enumerate(files)}
    out = {"tasks": tasks, "files": len(files), "file_kb": round(statistics.mean(size.values()) / 1024),
           "adapters_asked": sum(len(s) for s in stream), "disk": {}, "held": {}}
    for mb in budgets:
        fetched = []

        def fetch(source, dest, cfg):
            i = int(source.url.rsplit("/a", 1)[1].split(".")[0])
            shutil.copyfile(files[i].path, dest)
            fetched.append(size[i])

        with tempfile.TemporaryDirectory() as root:
            cfg = LoraConfig(allow=("https://bench.invalid/",), cache_dir=root, cache_mb=mb)
            cache = AdapterCache(cfg, fetch)
            cache.open()
            for picked in stream:
                for i in picked:
                    cache.get(Source(f"https://bench.invalid/a{i}.safetensors", "input.loras[0].source"))
        asked = cache.hits + cache.misses
        out["disk"][f"{mb} MiB"] = {"hit rate": round(cache.hits / asked, 3), "fetches": len(fetched),
                                    "MB fetched": round(sum(fetched) / 2**20, 1)}
    for label, holder in (("by name, keep 8", lambda e: Adapters(e.pipe, keep=8)), ("3 slots", None)):
        eng = engine(model, "cpu")
        if holder is None:
            held = Slots(eng.pipe, 3, 64)
            held.prepare()
        else:
            held = holder(eng)
        t0 = time.perf_counter()
        for picked in stream:
            held.use([Wanted(files[i].sha256, files[i].path, 1.0) for i in picked])
        out["held"][label] = {"loads": held.loads, "loads per task": round(held.loads / tasks, 3),
                              "switch ms per task": round((time.perf_counter() - t0) * 1000 / tasks, 2)}
    return out


def part_full_size(ranks: tuple[int, ...] = (16, 32, 64)) -> dict:
    import torch
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        transformer = FluxTransformer2DModel(guidance_embeds=False)  # FLUX.1-schnell's shapes
    linears = [m for m in transformer.modules() if isinstance(m, torch.nn.Linear)]
    base = sum(m.in_features * m.out_features for m in linears)
    out = {"linear layers": len(linears), "their parameters (G)": round(base / 1e9, 2), "per slot": {}}
    for rank in ranks:
        extra = sum(rank * (m.in_features + m.out_features) for m in linears)
        out["per slot"][f"rank {rank}"] = {"parameters (M)": round(extra / 1e6, 1), "bf16 MB": round(extra * 2 / 1e6),
                                           "share of linear multiply-adds": round(extra / base, 4)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench lora", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("models/tiny-flux"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--files", type=int, default=12, help="adapters in the mixed load")
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--budgets", default="1,2,4", help="cache budgets to try, MiB")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", type=Path, default=Path("var/bench/lora.json"))
    args = p.parse_args(argv)
    import diffusers
    import peft
    import torch

    torch.set_num_threads(1)
    report = {"device": args.device, "host": platform.processor() or platform.machine(), "torch": torch.__version__,
              "diffusers": diffusers.__version__, "peft": peft.__version__, "size": list(SIZE), "steps": 4,
              "model": str(args.model), "threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        files = adapters(args.model, Path(tmp), args.files, 64)
        report["full size"] = part_full_size()
        print("full size", report["full size"], flush=True)
        report["round"] = part_round(args.model, args.device, files, args.rounds)
        print("round", report["round"], flush=True)
        report["switch"] = part_switch(args.model, args.device, files)
        print("switch", report["switch"], flush=True)
        report["cache"] = part_cache(args.model, files, args.tasks, tuple(int(b) for b in args.budgets.split(",")))
        print("cache", report["cache"], flush=True)
        if args.compile:
            report["compile"] = part_compile(args.model, args.device, files)
    save(args.out, report)
    return 0
