"""What each safety check costs per prompt or image: `python -m bench safety` (or `make bench-safety`).

The models have the real architectures with random weights (detoxify's BERT-base, a ViT-base/16
NSFW classifier) or ship in their wheels (NudeNet, alt-profanity-check); speed does not depend on
the weights' values. Each figure is the median (and p95, p99) over `--repeats` calls after warm-up
calls, run one after another in one process on the same inputs; the embedded default's whole prompt
check instead over the ordinary prompts of the held-out sets (benign, tagged plain), each once, with
the share the policy's encoder read. Writes JSON to `--out`.
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

PROMPT = ("a cinematic photograph of a lighthouse on a rocky cliff at dawn, waves crashing below, "
          "golden light, seagulls, 35mm film, high detail")
# A burst: 16 distinct prompts of the lengths users write (13 to 29 tokens), as one lease call brings
# them to rank 0 at once.
BURST = [
    PROMPT,
    "portrait of an old sailor with a grey beard, oil painting, dramatic lighting",
    "a red fox sleeping in fresh snow under pine trees, soft morning light",
    "isometric illustration of a tiny coffee shop on a rainy street at night, neon signs, reflections on wet asphalt",
    "a bowl of ramen with a soft boiled egg, steam rising, food photography, shallow depth of field",
    "an astronaut riding a horse on mars, photorealistic, 8k",
    "watercolor painting of a quiet harbour town in the morning, boats, pastel colours",
    "a futuristic city skyline at sunset with flying cars and glass towers, ultra wide angle, volumetric light",
    "close-up of a hummingbird drinking nectar from a red flower, macro photography",
    "a cozy reading nook with a window seat, stacks of books, a sleeping cat, warm lamp light",
    "minimalist logo of a mountain and a river, flat vector, two colours",
    "a medieval knight in ornate armour standing in a misty forest, fantasy art, highly detailed",
    "aerial view of turquoise water and a white sand beach with palm trees, drone photography",
    "a steampunk owl made of brass gears and copper pipes, studio lighting, product shot",
    "children playing football in a dusty village square at golden hour, documentary photography",
    "a glass of iced lemonade on a wooden table in a sunny garden, bokeh background",
]


def timed(fn, repeats: int, warmup: int = 3) -> dict:
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return {"median_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 2),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2), "repeats": repeats}


def image(width: int, height: int) -> np.ndarray:
    # Smooth structure plus noise: closer to a real picture than noise alone (PNG/JPEG-like content).
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], -1) * 200
    noise = np.random.default_rng(0).normal(0, 20, (height, width, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def burst_rows(detox, repeats: int) -> list[dict]:
    """A burst of 16 prompts through the guard as the worker screens them: one call per prompt (as
    before 2026-11), then the whole burst in one call; per prompt, side by side."""
    from safety.config import SafetyConfig
    from safety.guard import Guard

    guard = Guard(SafetyConfig(), detox, None)
    n = max(5, repeats // 3)
    alone = timed(lambda: [guard.screen_prompt(p) for p in BURST], n)
    together = timed(lambda: guard.screen_prompts(BURST), n)
    return [{"check": f"text: detoxify, burst of {len(BURST)}, {how}", "per": "prompt",
             "median_ms": round(t["median_ms"] / len(BURST), 2), "p95_ms": round(t["p95_ms"] / len(BURST), 2),
             "repeats": t["repeats"]} for how, t in (("a call each", alone), ("one call", together))]


def run(device: str, repeats: int, sizes: list[tuple[int, int]], work: Path) -> dict:
    from safety.config import (DetoxifyConfig, HFClassifierConfig, NudeNetConfig, ProfanityConfig,
                               QualityCheckConfig, SafetyConfig)
    from safety.guard import Guard
    from safety.image import HFImageCheck, NudeNetCheck
    from safety.quality import inspect
    from bench.random_safety import make_detoxify_checkpoint, make_vit_classifier
    from safety.text import DetoxifyCheck, ProfanityCheck

    rows = []
    ckpt = make_detoxify_checkpoint(work / "detoxify", "base", corpus=BURST)  # whole-word tokens
    detox = DetoxifyCheck(DetoxifyConfig(checkpoint=str(ckpt), huggingface_config_path=str(work / "detoxify")),
                          device)
    tokens = len(detox._model.tokenizer(PROMPT)["input_ids"])
    rows.append({"check": f"text: detoxify (BERT-base, {tokens} tokens)", "per": "prompt",
                 **timed(lambda: detox.check([PROMPT]), repeats)})
    rows += burst_rows(detox, repeats)
    profanity = ProfanityCheck(ProfanityConfig())
    rows.append({"check": "text: alt-profanity-check", "per": "prompt", **timed(lambda: profanity.check([PROMPT]), repeats)})
    nudenet = NudeNetCheck(NudeNetConfig())
    vit = HFImageCheck(HFClassifierConfig(model=str(make_vit_classifier(work / "vit", "base")), batch_size=8), device)
    quality = QualityCheckConfig()
    for w, h in sizes:
        img = image(w, h)
        batch = [img] * 8
        rows += [
            {"check": "image: nudenet", "size": f"{w}x{h}", "per": "image", **timed(lambda: nudenet.check([img]), repeats)},
            {"check": "image: hf ViT-base/16", "size": f"{w}x{h}", "per": "image", **timed(lambda: vit.check([img]), repeats)},
            {"check": "image: hf ViT-base/16, batch of 8", "size": f"{w}x{h}", "per": "batch of 8",
             **timed(lambda: vit.check(batch), max(3, repeats // 4))},
            {"check": "quality", "size": f"{w}x{h}", "per": "image",
             **timed(lambda: inspect(img, 0, quality.min_std), repeats)},
        ]
    # The embedded default's whole prompt check (configs/tiny.toml: text backend auto without a
    # detoxify checkpoint): the policy's lists and learned layer through the guard, prompt by prompt.
    from safety.config import TextCheckConfig
    from safety.policy.prompt_policy import PromptPolicy

    embedded = SafetyConfig(text=TextCheckConfig(backend="auto"))
    policy = PromptPolicy.load(embedded.text.policy)
    guard = Guard(embedded, None, None, policy)
    # Ordinary prompts: the benign ones tagged plain in the held-out sets (written apart from the
    # policy), each once; the encoder reads the few the learned layer is unsure of.
    from bench.policy import DEFAULT_SETS, load_set

    ordinary = [r.prompt for path in DEFAULT_SETS if path.is_dir() for r in load_set(path)
                if r.cat == "benign" and "plain" in r.tags]
    asked = policy.encoder_asked
    each = iter(ordinary)
    rows.append({"check": f"text: the embedded default's whole prompt check, {len(ordinary)} ordinary prompts",
                 "per": "prompt", **timed(lambda: guard.screen_prompt(next(each)), len(ordinary) - 3)})
    rows[-1]["encoder_read"] = round((policy.encoder_asked - asked) / len(ordinary), 4)
    # What the guard's timeout thread adds to a call, side by side with the bare call.
    guard = Guard(SafetyConfig(), profanity, None)
    bare, bounded = timed(lambda: profanity.check([PROMPT]), repeats), timed(lambda: guard.screen_prompt(PROMPT), repeats)
    rows.append({"check": "guard overhead (bounded - bare call)", "per": "call",
                 "median_ms": round(bounded["median_ms"] - bare["median_ms"], 3), "p95_ms": None, "repeats": repeats})
    return {"device": device, "machine": platform.processor() or platform.machine(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench safety", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="where detoxify and the ViT run (cpu, cuda)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 leaves torch's default")
    p.add_argument("--size", action="append", default=[], metavar="WxH", help="image sizes (default 1360x768, 1024x1024)")
    p.add_argument("--out", default="var/bench/safety.json")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.size] or [(1360, 768), (1024, 1024)]
    with tempfile.TemporaryDirectory() as work:
        report = run(args.device, args.repeats, sizes, Path(work))
    report["torch_threads"] = torch.get_num_threads()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"{'check':40} {'size':>10} {'per':>11} {'median ms':>10} {'p95 ms':>8} {'p99 ms':>8}")
    for r in report["rows"]:
        p95 = "" if r["p95_ms"] is None else f"{r['p95_ms']:.2f}"
        p99 = "" if r.get("p99_ms") is None else f"{r['p99_ms']:.2f}"
        read = f"  (the encoder read {r['encoder_read']:.1%})" if "encoder_read" in r else ""
        print(f"{r['check']:40} {r.get('size', ''):>10} {r['per']:>11} {r['median_ms']:>10.2f} {p95:>8} {p99:>8}{read}")
    print(f"device {args.device}, {report['torch_threads']} torch threads; written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
