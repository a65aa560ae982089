"""How well the prompt check refuses what it must and passes the rest, on labelled prompt sets:
`python -m bench policy` (the first half of `make bench-safety`).

For each setup (the policy: its lists and learned layer, which is the embedded default's whole text
check; the lists without the learned layer; the policy followed by each model backend that runs
offline, and for comparison each backend alone) it prints recall per unsafe category, per language
and on disguised prompts, the share of benign prompts passed, and the time per prompt (median, p95
and p99 over every prompt of the set, each timed alone, on one thread; the policy's encoder on one
thread too) with the share of prompts the encoder read; with `--by-language`, recall for
each language and category and by form (paraphrase, obfuscated, ...). Writes JSON to `--out`.

A set is JSON lines: {"cat": sexual | sexual_minors | violence | hate | self_harm | benign,
"lang": a language code, "tags": [...], "prompt": ...}. The project's own set is
tests/safety/data/prompts.jsonl, written with the lists; heldout-1, heldout-2 and the folders
heldout-3 to heldout-21 (nineteen languages) were written apart from them. All twenty-two run by
default; `--set` for another.
detoxify needs a trained checkpoint (`--detoxify-checkpoint`, offline form: `dit-worker
detoxify-offline`): random weights would measure nothing, so without one it is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "safety" / "data"
DEFAULT_SET = DATA / "prompts.jsonl"
DEFAULT_SETS = (DEFAULT_SET, DATA / "heldout-1.jsonl", DATA / "heldout-2.jsonl", DATA / "heldout-3",
                DATA / "heldout-4", DATA / "heldout-5", DATA / "heldout-6",
                DATA / "heldout-7", DATA / "heldout-8", DATA / "heldout-9", DATA / "heldout-10",
                DATA / "heldout-11", DATA / "heldout-12", DATA / "heldout-13",
                DATA / "heldout-14", DATA / "heldout-15", DATA / "heldout-16",
                DATA / "heldout-17", DATA / "heldout-18", DATA / "heldout-19", DATA / "heldout-20",
                DATA / "heldout-21")
UNSAFE = ("sexual", "sexual_minors", "violence", "hate", "self_harm")
FORMS = ("plain", "paraphrase", "obfuscated", "inflected", "coded", "mixed")  # tags read as forms


@dataclass(frozen=True)
class Row:
    cat: str
    lang: str
    tags: tuple[str, ...]
    prompt: str

    @property
    def unsafe(self) -> bool:
        return self.cat != "benign"


@dataclass
class Figures:
    setup: str
    recall: dict[str, float] = field(default_factory=dict)  # per unsafe category
    recall_by_lang: dict[str, float] = field(default_factory=dict)
    recall_by_lang_cat: dict[str, dict[str, float]] = field(default_factory=dict)  # lang -> cat -> recall
    recall_by_form: dict[str, float] = field(default_factory=dict)  # unsafe prompts by tag
    benign_by_lang: dict[str, float] = field(default_factory=dict)
    recall_disguised: float | None = None
    benign_passed: float = 0.0
    false_refusals: int = 0
    benign: int = 0
    unsafe: int = 0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    encoder_asked: float | None = None  # the share of prompts the policy's encoder read (None: no encoder)
    misses: list[dict] = field(default_factory=list)  # unsafe passed and benign refused


def load_set(path: str | Path) -> list[Row]:
    """A set's rows; a directory is one set of all its .jsonl files."""
    path = Path(path)
    if path.is_dir():
        return [row for part in sorted(path.glob("*.jsonl")) for row in load_set(part)]
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if d["cat"] not in UNSAFE + ("benign",):
            raise ValueError(f"{path}:{n}: cat {d['cat']!r} is not one of {UNSAFE + ('benign',)}")
        rows.append(Row(d["cat"], d["lang"], tuple(d.get("tags", ())), d["prompt"]))
    return rows


def evaluate(setup: str, refuses: Callable[[str], bool], rows: list[Row]) -> Figures:
    hit: dict[str, list[bool]] = defaultdict(list)
    by_lang: dict[str, list[bool]] = defaultdict(list)
    by_lang_cat: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    by_form: dict[str, list[bool]] = defaultdict(list)
    benign_lang: dict[str, list[bool]] = defaultdict(list)
    disguised, passed, ms, misses = [], [], [], []
    asked = getattr(refuses, "encoder_asked", None)  # a counter of prompts the encoder read, where there is one
    asked_before = asked() if asked else 0
    for row in rows:
        t0 = time.perf_counter()
        refused = refuses(row.prompt)
        ms.append((time.perf_counter() - t0) * 1e3)
        if row.unsafe:
            hit[row.cat].append(refused)
            by_lang[row.lang].append(refused)
            by_lang_cat[row.lang][row.cat].append(refused)
            for tag in row.tags:
                if tag in FORMS:
                    by_form[tag].append(refused)
            if "obfuscated" in row.tags:
                disguised.append(refused)
        else:
            passed.append(not refused)
            benign_lang[row.lang].append(not refused)
        if refused != row.unsafe:
            misses.append({"cat": row.cat, "lang": row.lang, "tags": list(row.tags), "prompt": row.prompt})
    ms.sort()
    return Figures(
        setup, recall={c: _share(hit[c]) for c in UNSAFE if hit[c]},
        recall_by_lang={lang: _share(v) for lang, v in sorted(by_lang.items())},
        recall_by_lang_cat={lang: {c: _share(cs[c]) for c in UNSAFE if cs[c]} for lang, cs in sorted(by_lang_cat.items())},
        recall_by_form={t: _share(by_form[t]) for t in FORMS if by_form[t]},
        benign_by_lang={lang: _share(v) for lang, v in sorted(benign_lang.items())},
        recall_disguised=_share(disguised) if disguised else None,
        benign_passed=_share(passed) if passed else 1.0, false_refusals=passed.count(False),
        benign=len(passed), unsafe=sum(len(v) for v in hit.values()),
        p50_ms=round(statistics.median(ms), 4), p95_ms=round(ms[int(0.95 * (len(ms) - 1))], 4),
        p99_ms=round(ms[int(0.99 * (len(ms) - 1))], 4),
        encoder_asked=round((asked() - asked_before) / len(rows), 4) if asked else None, misses=misses)


def _share(flags: list[bool]) -> float:
    return round(sum(flags) / len(flags), 4)


def setups(detoxify_checkpoint: str | None) -> list[tuple[str, Callable[[str], bool]]]:
    """(name, refuses) for each setup that can run here. The policy runs first, as in the worker."""
    from safety.config import DetoxifyConfig, PolicyConfig, ProfanityConfig
    from safety.policy.prompt_policy import PromptPolicy
    from safety.text import DetoxifyCheck, ProfanityCheck

    policy = PromptPolicy.load(PolicyConfig(encoder_threads=1))  # one core, as the figures say
    backends = [("alt-profanity-check", ProfanityCheck(ProfanityConfig()))]
    if detoxify_checkpoint:
        folder = Path(detoxify_checkpoint)
        backends.append(("detoxify", DetoxifyCheck(DetoxifyConfig(
            checkpoint=str(folder / "detoxify.ckpt"), huggingface_config_path=str(folder)), "cpu")))

    def alone(check):
        return lambda p: check.check([p])[0].refused

    def after_policy(check):
        return lambda p: policy.judge(p).refused or check.check([p])[0].refused

    lists_only = PromptPolicy.load(PolicyConfig(learned=False))
    no_encoder = PromptPolicy.load(PolicyConfig(encoder=False))

    def judged(p: str) -> bool:
        return policy.judge(p).refused

    judged.encoder_asked = lambda: policy.encoder_asked
    out = [(f"policy {policy.version}", judged),
           ("policy, encoder off (encoder=false)", lambda p: no_encoder.judge(p).refused),
           ("lists alone (learned=false)", lambda p: lists_only.judge(p).refused)]
    out += [(f"policy + {name}", after_policy(check)) for name, check in backends]
    out += [(f"{name} alone", alone(check)) for name, check in backends]
    return out


def report(sets: dict[str, list[Row]], detoxify_checkpoint: str | None = None,
           only: str | None = None) -> dict[str, list[Figures]]:
    runs = [(name, fn) for name, fn in setups(detoxify_checkpoint) if not only or name.startswith(only)]
    return {name: [evaluate(setup, refuses, rows) for setup, refuses in runs] for name, rows in sets.items()}


def print_table(name: str, rows: list[Row], figures: list[Figures]) -> None:
    counts = defaultdict(int)
    for r in rows:
        counts[r.cat] += 1
    print(f"\n{name}: {len(rows)} prompts ({', '.join(f'{c} {counts[c]}' for c in UNSAFE + ('benign',))})")
    cols = list(UNSAFE) + ["disguised", "en", "fr", "es", "de", "benign ok", "p50 ms", "p95 ms", "p99 ms", "encoder"]
    print(f"{'setup':34}" + "".join(f"{c[:13]:>14}" for c in cols))
    for f in figures:
        vals = [f.recall.get(c) for c in UNSAFE] + [f.recall_disguised] + \
               [f.recall_by_lang.get(lang) for lang in ("en", "fr", "es", "de")] + [f.benign_passed]
        cells = ["-" if v is None else f"{v:.3f}" for v in vals] + [f"{f.p50_ms:.3f}", f"{f.p95_ms:.3f}",
                                                                    f"{f.p99_ms:.3f}",
                                                                    "-" if f.encoder_asked is None else f"{f.encoder_asked:.3f}"]
        print(f"{f.setup[:33]:34}" + "".join(f"{c:>14}" for c in cells))


def print_languages(f: Figures) -> None:
    """One setup's recall per language and category, benign passed per language, and by form."""
    print(f"\n{f.setup}: recall by language and category (n/a: no prompts)")
    cols = list(UNSAFE) + ["benign ok"]
    print(f"{'lang':6}" + "".join(f"{c[:13]:>14}" for c in cols))
    for lang in sorted(set(f.recall_by_lang_cat) | set(f.benign_by_lang)):
        vals = [f.recall_by_lang_cat.get(lang, {}).get(c) for c in UNSAFE] + [f.benign_by_lang.get(lang)]
        print(f"{lang:6}" + "".join(f"{'n/a' if v is None else format(v, '.3f'):>14}" for v in vals))
    print("by form: " + ", ".join(f"{t} {v:.3f}" for t, v in f.recall_by_form.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench policy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], help="a labelled set, or a folder of them read as one "
                   "(default: every set in tests/safety/data)")
    p.add_argument("--detoxify-checkpoint", help="a folder with a trained detoxify.ckpt and its HF files")
    p.add_argument("--misses", action="store_true", help="print every prompt a setup got wrong")
    p.add_argument("--by-language", action="store_true", help="recall per language and category, and by form")
    p.add_argument("--only", help="run only the setups whose name starts with this (e.g. policy)")
    p.add_argument("--out", default="var/bench/policy.json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # one core, as the figures say
    sets = {name: load_set(name) for name in args.set or [str(p) for p in DEFAULT_SETS]}
    results = report(sets, args.detoxify_checkpoint, args.only)
    for name, figures in results.items():
        print_table(name, sets[name], figures)
        if args.by_language:
            for f in figures:
                print_languages(f)
        if args.misses:
            for f in figures:
                for m in f.misses:
                    print(f"  {f.setup}: {m['cat']}/{m['lang']}: {m['prompt']!r}")
    if not args.detoxify_checkpoint:
        print("\ndetoxify left out: no --detoxify-checkpoint (random weights would measure nothing)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({n: [vars(f) for f in fs] for n, fs in results.items()}, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
