"""What LoRA adapters cost: `python -m bench lora` (or `make bench-lora`).

On the tiny FLUX model on the CPU by default; `--arch flux.1-schnell --device cuda` for the
full-size architecture with random weights in bfloat16 at 1360x768 (`--model DIR` for weights on
disk). Random adapters of `--rank` (64) on every attention and feed-forward layer, made from the
transformer's own shapes at start. The parts (`--parts`, all by default), in one process, each
engine built once and shared:

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
from dataclasses import dataclass, field
from pathlib import Path

from bench.reports import save

TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
           "ff.net.0.proj", "ff.net.2", "proj_mlp", "proj_out")
PARTS = ("fullsize", "round", "switch", "cache", "compile")


@dataclass
class Setup:
    """The model every part uses, and its engines, each built once (a full-size pipeline is 33 GB)."""

    model: str = ""  # a directory; empty: random weights of `arch`
    arch: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    size: tuple[int, int] = (128, 128)
    rank: int = 64
    _engines: dict = field(default_factory=dict)

    def engine(self, compile_: bool = False, slots: int = 0):
        key = (compile_, slots)
        if key not in self._engines:
            self._engines[key] = self._load(compile_, slots)
        return self._engines[key]

    def drop(self) -> None:
        import gc

        import torch

        self._engines.clear()
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def _load(self, compile_: bool, slots: int):
        import torch

        from worker.config import LoraConfig, ModelConfig, SpeedConfig
        from worker.model.engine import Engine

        cfg = ModelConfig(name="bench", source=self.model or "random", random_arch="none" if self.model else self.arch,
                          dtype=self.dtype, device=self.device, max_sequence_length=64 if self.arch == "tiny" else 256)
        lora = LoraConfig(allow=("https://bench.invalid/",), max_adapters=slots, max_rank=self.rank) if slots else None
        return Engine.load(cfg, torch.device(self.device), SpeedConfig(compile=compile_), lora=lora)

    def job(self, seed: int = 0, steps: int = 4):
        from worker.model.job import Job

        return Job(task_id=f"b{seed}", prompt="a lighthouse at dusk, watercolour", width=self.size[0],
                   height=self.size[1], steps=steps, seed=seed, output_format="png")

    def timed(self, fn) -> float:
        import torch

        t0 = time.perf_counter()
        fn()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()  # a switch's copies are queued on the device
        return (time.perf_counter() - t0) * 1000

    def median_round(self, eng, rounds: int) -> float:
        eng.generate(self.job())  # warm
        return statistics.median(self.timed(lambda: eng.generate(self.job())) for _ in range(rounds))


def adapters(setup: Setup, out: Path, n: int) -> list:
    """`n` adapter files of rank `setup.rank` on every TARGETS layer of the transformer, random and
    non-zero, saved as diffusers saves one."""
    import torch
    from safetensors.torch import save_file

    from worker.model.adapters import Wanted

    linears = [(name, m.in_features, m.out_features) for name, m in setup.engine().pipe.transformer.named_modules()
               if isinstance(m, torch.nn.Linear) and name.endswith(TARGETS)]
    dtype = getattr(torch, setup.dtype)
    made = []
    for i in range(n):
        gen = torch.Generator().manual_seed(100 + i)
        weights = {}
        for name, n_in, n_out in linears:
            weights[f"transformer.{name}.lora_A.weight"] = (torch.randn(setup.rank, n_in, generator=gen)
                                                            / n_in ** 0.5).to(dtype)
            weights[f"transformer.{name}.lora_B.weight"] = (torch.randn(n_out, setup.rank, generator=gen)
                                                            / setup.rank ** 0.5 * 0.1).to(dtype)
        path = out / f"a{i}.safetensors"
        save_file(weights, str(path))
        made.append(Wanted(hashlib.sha256(path.read_bytes()).hexdigest(), path, 1.0))
    return made


def sets(files, n: int) -> list:
    from worker.model.adapters import Wanted

    return [Wanted(f.sha256, f.path, 0.8) for f in files[:n]]


def part_round(setup: Setup, files, rounds: int) -> dict:
    plain = setup.engine()
    rows = {"plain (no adapter loaded)": {"0": setup.median_round(plain, rounds)}}
    named = {}
    for n in (0, 1, 3):
        plain.adapters.use(sets(files, n) if n else [])
        if n == 0:
            plain.adapters.use(sets(files, 3))  # held, then off: what a worker that has served adapters runs
            plain.adapters.use([])
        named[str(n)] = setup.median_round(plain, rounds)
    rows["unfused, by name"] = named
    fused = {"0": named["0"]}
    for n in (1, 3):
        plain.adapters.use(sets(files, n))
        plain.pipe.fuse_lora(adapter_names=[f.name for f in sets(files, n)])
        fused[str(n)] = setup.median_round(plain, rounds)
        plain.pipe.unfuse_lora()
    plain.adapters.clear()
    rows["fused into the weights"] = fused
    eng, slots = slotted(setup)
    rows[f"3 slots of rank {setup.rank} (eager)"] = {
        str(n): (slots.use(sets(files, n)), setup.median_round(eng, rounds))[1] for n in (0, 1, 3)}
    base = rows["plain (no adapter loaded)"]["0"]
    return {"ms": rows, "vs_plain": {k: {n: round(v / base, 3) for n, v in r.items()} for k, r in rows.items()}}


def slotted(setup: Setup):
    """Three slots on an uncompiled engine of its own (the compiled mode's holder, eager)."""
    from worker.model.adapters import Slots

    if "slots" not in setup._engines:
        eng = setup._load(False, 0)
        slots = Slots(eng.pipe, 3, setup.rank)
        slots.prepare()
        setup._engines["slots"] = (eng, slots)
    return setup._engines["slots"]


def part_switch(setup: Setup, files, repeats: int = 5) -> dict:
    from worker.model.adapters import Adapters, Wanted

    timed = setup.timed

    def scaled(ws, s):
        return [Wanted(w.sha256, w.path, s) for w in ws]

    out = {}
    a = setup.engine()
    a.adapters.clear()
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
    named.clear()
    _, slots = slotted(setup)
    slots.clear()
    first = timed(lambda: slots.use(sets(files, 3)))
    loads = statistics.median(timed(lambda: slots.use(sets(files, 3) if i % 2 else sets(files[3:], 3)))
                              for i in range(repeats))
    scale = statistics.median(timed(lambda: slots.use(scaled(sets(files[3:], 3), 0.5 + i / 10)))
                              for i in range(repeats))
    out["3 slots"] = {"first load of 3": first, "a new set of 3 (copied in)": loads, "scale change": scale}
    return {"ms": out}


def part_compile(setup: Setup, files) -> dict:
    import torch
    from torch._dynamo.utils import counters

    from worker.model.adapters import Adapters

    def graphs() -> int:
        return counters["stats"]["unique_graphs"]

    out = {}
    for label, slotted in (("3 slots, compiled", True), ("by name, compiled", False)):
        torch._dynamo.reset()
        setup.drop()  # one pipeline at a time on the device
        eng = setup.engine(compile_=True, slots=3 if slotted else 0)
        holder = eng.adapters if slotted else Adapters(eng.pipe)
        before = graphs()
        first = setup.timed(lambda: eng.generate(setup.job()))
        row = {"first round (compile) ms": first, "graphs": graphs() - before, "switches": []}
        for n, start in ((1, 0), (3, 0), (3, 3), (0, 0)):
            g = graphs()
            ms = setup.timed(lambda: (holder.use(sets(files[start:], n) if n else []), eng.generate(setup.job())))
            row["switches"].append({"to": f"{n} adapters" + (f" (files {start}..)" if n else ""),
                                    "round ms": ms, "graphs compiled": graphs() - g})
        out[label] = row
        print(label, row, flush=True)
    torch._dynamo.reset()
    return out


def part_cache(setup: Setup, files, tasks: int, budgets: tuple[int, ...], seed: int = 0) -> dict:
    from worker.adapters import AdapterCache, Source
    from worker.config import LoraConfig
    from worker.model.adapters import Adapters, Wanted

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
    for label in ("by name, keep 8", "3 slots"):
        if label == "3 slots":
            _, held = slotted(setup)
            held.clear()
            held.loads = 0
        else:
            eng = setup.engine()
            eng.adapters.clear()
            held = Adapters(eng.pipe, keep=8)
        t0 = time.perf_counter()
        for picked in stream:
            held.use([Wanted(files[i].sha256, files[i].path, 1.0) for i in picked])
        out["held"][label] = {"loads": held.loads, "loads per task": round(held.loads / tasks, 3),
                              "switch ms per task": round((time.perf_counter() - t0) * 1000 / tasks, 2)}
        held.clear()
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
    p.add_argument("--arch", choices=("tiny", "flux.1-schnell"), default="tiny", help="random weights of this")
    p.add_argument("--model", default="", help="a model directory instead of random weights (of --arch's size)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="float32 on a CPU, bfloat16 on a GPU")
    p.add_argument("--size", help="WxH; by default 128x128 for --arch tiny, 1360x768 for the full size")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--parts", default=",".join(PARTS), help=f"which of {', '.join(PARTS)}")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--files", type=int, default=12, help="adapters in the mixed load")
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--budgets", default="1,2,4", help="cache budgets to try, MiB")
    p.add_argument("--out", type=Path, default=Path("var/bench/lora.json"))
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    if unknown := parts - set(PARTS):
        p.error(f"--parts: no part named {', '.join(sorted(unknown))}")
    import diffusers
    import peft
    import torch

    gpu = args.device.startswith("cuda")
    width, height = map(int, (args.size or ("128x128" if args.arch == "tiny" else "1360x768")).split("x"))
    setup = Setup(args.model, args.arch, args.device, args.dtype or ("bfloat16" if gpu else "float32"),
                  (width, height), args.rank)
    if not gpu:
        torch.set_num_threads(1)
    report = {"device": torch.cuda.get_device_name() if gpu else (platform.processor() or platform.machine()),
              "torch": torch.__version__, "diffusers": diffusers.__version__, "peft": peft.__version__,
              "model": args.model or f"random weights ({args.arch})", "dtype": setup.dtype, "size": [width, height],
              "steps": 4, "rank": args.rank, "threads": torch.get_num_threads()}

    def part(name: str, run) -> None:
        if name in parts:
            report[name] = run()
            print(name, report[name], flush=True)
            save(args.out, report)  # each part kept as it ends

    part("fullsize", part_full_size)
    with tempfile.TemporaryDirectory() as tmp:
        files = adapters(setup, Path(tmp), args.files) if parts - {"fullsize"} else []
        part("round", lambda: part_round(setup, files, args.rounds))
        part("switch", lambda: part_switch(setup, files))
        part("cache", lambda: part_cache(setup, files, args.tasks, tuple(int(b) for b in args.budgets.split(","))))
        part("compile", lambda: part_compile(setup, files))
    return 0
