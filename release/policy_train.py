"""Trains the policy's learned layer from the project's labelled prompts: `make policy-model`.

Reads safety/policy/training/*.jsonl (the same JSON lines as the evaluation sets: cat, lang, tags,
prompt) and the teacher's embeddings of them (training/teacher/, `make policy-teacher`). First the
meaning table (safety.policy.learned.MeaningTable): one vector per word piece, by ridge regression
so that a prompt's mean piece vector reproduces the teacher's embedding of it (conjugate gradients
on the sparse normal equations, all columns at once). Then each prompt's features: as the lists read
it (safety.policy.normalize), hashed (safety.policy.learned.Features), beside its meaning from a
table fitted without its fold (5 folds, fixed split; the held-back prompts in every fit), as the
classifier will see an unseen prompt; and a multinomial logistic regression on both (scikit-learn,
lbfgs).
Each category's threshold is chosen on out-of-fold probabilities (5 folds, fixed split): the
lowest that keeps the benign prompts of the training data refused at most `--max-false` of the
time (one in a hundred, by default); and a lower one for "sexual" beside a minor and a higher one for
"hate" beside a group, each held to the same share of the benign prompts that name one. Writes learned.safetensors (weights of the hashed features
seen, float16; the table, int8 with a scale per piece, 15 MB), learned.tokenizer.json (the teacher's pruned tokenizer)
and learned.json (the card, with the policy digest it was built for) next to the lists, where `make
install` builds them. The same data and settings give the same bytes.

Never give it the sets the policy is measured on (tests/safety/data/, held-out sets): the card
records the digest of what it was trained on, and the tests check that no measured prompt is in it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from safety.policy import lists
from safety.policy.learned import CARD, TOKENIZER, WEIGHTS, Features, MeaningTable, content, teacher_key
from safety.policy.normalize import native, split, to_ascii

REPO = Path(__file__).resolve().parents[1]
TRAINING = REPO / "safety" / "policy" / "training"
TEACHER = TRAINING / "teacher"  # release/policy_teacher.py writes it: embeddings, its card, the tokenizer
TEACHER_TOKENIZER = "tokenizer.json"
EMBEDDINGS = "*.e5.jsonl"  # one file per file of prompts (release/policy_teacher.py writes them)
# The code that shapes the bytes (the Makefile rebuilds when one changes; the card records their
# digest, and the tests compare it with the checkout's). The lists and forms are in the policy digest.
SOURCES = ("release/policy_train.py", "safety/policy/learned.py", "safety/policy/normalize.py",
           "safety/policy/prompt_policy.py", "safety/policy/lists.py")
CLASSES = ["benign", "sexual_minors", "sexual", "violence", "hate", "self_harm"]
C = 4.0  # inverse regularisation strength
# Benign prompts weigh twice an unsafe one in the fit: with three unsafe prompts to each benign
# one, style words ("aesthetic", "lofi") would otherwise lean to whichever category used them.
BENIGN_WEIGHT = 2.0
MAX_FALSE = 0.01  # the share of benign training prompts a threshold may refuse, out of fold
# Self-harm may refuse 1.5%: at 1% its threshold was 0.7, at 1.5% 0.5, and self-harm recall rose
# 0.915 -> 0.944 on heldout-3 to heldout-13 on average (paraphrase 0.886 -> 0.904) for benign
# passed 0.959 -> 0.956 (a chicken-breast recipe, a blood donation poster). Violence at 1.5% as
# well (0.5 -> 0.45) added 0.7 points of violence recall for as many again of benign passed, among
# them a bloodhound on a trail and a street seller of cendol: not kept.
MAX_FALSE_BY = {"self_harm": 0.015}
# Where a category's threshold starts. Hate's false refusals out of fold are few, but on the
# regression sets' benign prompts (heldout-1, heldout-2: a dog "dying of laughter", a pet rat) the
# learned hate refused 5 in 110 at 0.5 and 2 at 0.6; beside a people named, the benign training
# prompts allowed 0.65 once the layer read meaning, which refused a Muslim family at Eid (0.68) and
# a Jewish family at Hanukkah (0.76) in heldout-2: chosen there, never on a set measured first.
# Sexual, violence and self-harm start at 0.3, so that MAX_FALSE alone sets them: at 0.5, sexual
# refused fewer benign training prompts than MAX_FALSE allows (its threshold came out at 0.3, and
# sexual recall rose 0.953 -> 0.968 on heldout-3 to heldout-13, minors on heldout-3 0.883 -> 0.906,
# benign passed 0.960 -> 0.959); violence and self-harm came out where they were bound anyway.
FLOOR = {"hate": 0.6, "hate_with_group": 0.8, "sexual": 0.3, "violence": 0.3, "self_harm": 0.3}
# The encoder's head reads a whole sentence, not word pieces: beside a people named, the benign
# training prompts set its threshold from hate's floor (it comes out at 0.75). With the table's 0.8
# it let pass prompts it read at 0.75-0.79 (gay men hanged from a crane, "this is what they
# deserve"); at 0.75, hate on the regression sets rose up to 1.6 points, benign passed unchanged on
# every one. Asking it wherever a people is named (band 0.2 there) changed no recall and refused
# two benign prompts of heldout-2: not kept.
ENCODER_FLOOR = {**FLOOR, "hate_with_group": 0.6}
# The meaning table. Chosen on heldout-3 to heldout-5 and the regression sets' benign prompts, never
# on a set measured first: the ridge penalty of its fit; how much a prompt's meaning (a unit vector,
# less the training prompts' mean) weighs beside its hashed features (about thirty, each 1/sqrt(n));
# the number of words from which it counts fully (a short prompt's mean is what one word is near:
# "Nacktkatze", a sphynx cat, read as nudity; with 12, the benign prompts of heldout-2 passed 0.982
# against 0.936); and whether the held-back prompts are fitted on too (they teach the table what
# words mean, not the classifier labels: hate on heldout-4 0.87 -> 0.93, self-harm 0.89 -> 0.92).
TABLE_RIDGE = 0.1
TABLE_SCALE = 2.0
TABLE_CENTER = True
TABLE_FULL_WORDS = 12
TABLE_HELD_BACK = True
TABLE_TOLERANCE = 1e-4  # conjugate gradients stop when every column's residual is this share of the largest


def read(folder: Path = TRAINING) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                d = json.loads(line)
                if d["cat"] not in CLASSES:
                    raise ValueError(f"{path}:{n}: cat {d['cat']!r} is not one of {CLASSES}")
                rows.append(d)
    return rows


def data_digest(folder: Path = TRAINING) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.jsonl")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()[:16]


def code_digest(sources: tuple[str, ...] = SOURCES) -> str:
    """The digest of the code that shapes a build's bytes (these files of the checkout)."""
    h = hashlib.sha256()
    for name in sources:
        h.update(name.encode() + b"\0" + (REPO / name).read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()[:16]


def words_of(prompt: str, leet: dict[str, str]) -> list[str]:
    """The words the layer reads: the prompt's content (learned.content), as the lists read it."""
    return split(to_ascii(native(content(prompt)), prepared=True), leet).words


def matrix(rows: list[dict], features: Features, leet: dict[str, str]):
    from scipy.sparse import csr_matrix

    indptr, indices = [0], []
    for r in rows:
        ids = features.ids(words_of(r["prompt"], leet))
        indices.extend(ids.tolist())
        indptr.append(len(indices))
    data = np.concatenate([np.full(indptr[i + 1] - indptr[i], 1 / np.sqrt(max(indptr[i + 1] - indptr[i], 1)))
                           for i in range(len(rows))]) if indices else np.zeros(0)
    return csr_matrix((data, np.array(indices, dtype=np.int64), np.array(indptr)), shape=(len(rows), 1 << features.bits))


def teacher_digest(teacher: Path = TEACHER) -> str:
    h = hashlib.sha256()
    for path in sorted(teacher.glob("*.*")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()[:16]


def teacher_embeddings(rows: list[dict], teacher: Path = TEACHER) -> np.ndarray:
    """The teacher's embedding of each prompt, by the prompt's hash; a prompt it never embedded
    stops the build."""
    known: dict[int, np.ndarray] = {}
    for path in sorted(teacher.glob(EMBEDDINGS)):
        for line in path.read_text(encoding="utf-8").splitlines():
            d = json.loads(line)
            known[d["key"]] = np.frombuffer(base64.b64decode(d["e5"]), dtype=np.int8).astype(np.float32) \
                * np.float32(d["scale"])
    missing = [r["prompt"] for r in rows if teacher_key(r["prompt"]) not in known]
    if missing:
        raise SystemExit(f"{teacher}: no teacher embedding for {len(missing)} training prompts (first: "
                         f"{missing[0]!r}): run `make policy-teacher`")
    return np.stack([known[teacher_key(r["prompt"])] for r in rows]).astype(np.float64)


def pieces(rows: list[dict], tokenizer):
    """Prompts x word pieces: each prompt's pieces, each weighing 1/(its number of pieces)."""
    from scipy.sparse import csr_matrix

    indptr, indices = [0], []
    for r in rows:
        indices.extend(MeaningTable.piece_ids(tokenizer, content(r["prompt"])))
        indptr.append(len(indices))
    counts = np.diff(indptr)
    data = np.repeat(1.0 / np.maximum(counts, 1), counts)
    a = csr_matrix((data, np.array(indices, dtype=np.int64), np.array(indptr)),
                   shape=(len(rows), tokenizer.get_vocab_size()))
    a.sum_duplicates()
    return a


def distil(a, targets: np.ndarray) -> np.ndarray:
    """The table: argmin_W |a W - targets|^2 + TABLE_RIDGE |W|^2, by conjugate gradients on
    (a'a + TABLE_RIDGE) W = a' targets, all 384 columns in one pass over `a` per step (scikit-learn's
    Ridge(solver="sparse_cg") solves them one at a time); one thread, so the same bytes. About 26
    steps and 15 s for the 15,243 prompts."""
    from threadpoolctl import threadpool_limits

    # Solved on the pieces the prompts use: a piece no prompt has keeps a zero row (its right-hand
    # side and every step are zero there, and the sums over rows add zeros), so the bytes are the
    # same, and a build on a few prompts no longer steps through the whole vocabulary.
    used = np.unique(a.indices)
    table = np.zeros((a.shape[1], targets.shape[1]))
    a = a[:, used]
    with threadpool_limits(1):
        at = a.T.tocsr()
        b = at @ targets
        w = np.zeros_like(b)
        r = b.copy()
        p = r.copy()
        rs = (r * r).sum(axis=0)
        stop = TABLE_TOLERANCE * np.sqrt(rs.max())
        for _ in range(1000):
            ap = at @ (a @ p) + TABLE_RIDGE * p
            alpha = rs / np.maximum((p * ap).sum(axis=0), 1e-300)
            w += alpha * p
            r -= alpha * ap
            new = (r * r).sum(axis=0)
            if np.sqrt(new.max()) < stop:
                break
            p = r + (new / np.maximum(rs, 1e-300)) * p
            rs = new
    table[used] = w
    return table


def quantise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row as int8 with one scale (its largest magnitude / 127): the teacher's embeddings and
    the table alike."""
    scale = np.maximum(np.abs(x).max(axis=1), 1e-12) / 127.0
    return np.round(x / scale[:, None]).clip(-127, 127).astype(np.int8), scale.astype(np.float32)


def quantised_table(table: np.ndarray) -> dict[str, np.ndarray]:
    """The table as int8, one scale per piece: 15 MB for 38,011 pieces, where float16 took 29 (a
    lent GPU's call carries 64 MB in all, the wheels included)."""
    q, scale = quantise(table)
    return {"table": q, "table_piece_scale": scale}


def meanings(a, table: np.ndarray) -> np.ndarray:
    m = np.asarray(a @ table)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-6)


def meaning_features(a, targets: np.ndarray, folds: np.ndarray, extra=None, jobs: int | None = None):
    """The table fitted on every prompt, and each prompt's meaning read with a table fitted
    without its fold: what the classifier learns from is what an unseen prompt gives it. `extra`
    (pieces, targets): more prompts every table is fitted on (the held-back ones: a table learns
    what words mean, not labels)."""
    from joblib import Parallel, delayed
    from scipy.sparse import vstack

    def more(x, t):
        return (vstack([x, extra[0]]).tocsr(), np.concatenate([t, extra[1]])) if extra is not None else (x, t)

    parts = [more(a, targets)] + [more(a[folds != k], targets[folds != k]) for k in range(5)]
    tables = Parallel(n_jobs=jobs or min(len(parts), os.cpu_count() or 1))(delayed(distil)(x, t) for x, t in parts)
    out = np.zeros(targets.shape)
    for k in range(5):
        out[folds == k] = meanings(a[folds == k], tables[k + 1])
    return tables[0], out


def fit(x, y):
    """One BLAS thread, wherever it runs: the sums then add up in the same order, and the weights
    are the same bytes on any machine and in any worker process."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    weights = {i: BENIGN_WEIGHT if c == "benign" else 1.0 for i, c in enumerate(CLASSES)}
    with threadpool_limits(1):
        return LogisticRegression(C=C, max_iter=500, tol=1e-4, solver="lbfgs", class_weight=weights).fit(x, y)


def folds_of(y: np.ndarray) -> np.ndarray:
    """Each prompt's fold (0-4), fixed by its place in the data."""
    return np.arange(len(y)) % 5


def fit_all(x, y, jobs: int | None = None):
    """The model on every prompt, and the five out-of-fold ones `thresholds` judges with: six fits,
    as many at once as there are cores (each is the same alone or beside the others)."""
    from joblib import Parallel, delayed

    folds = folds_of(y)
    parts = [(x, y)] + [(x[folds != k], y[folds != k]) for k in range(5)]
    models = Parallel(n_jobs=jobs or min(len(parts), os.cpu_count() or 1))(delayed(fit)(a, b) for a, b in parts)
    return models[0], models[1:]


def thresholds(x, y, fold_models: list, max_false: float, minors: np.ndarray,
               groups: np.ndarray, floor: dict[str, float] = FLOOR) -> dict[str, float]:
    """Per category, the lowest threshold (on a 0.05 grid from the category's `floor`, else 0.5; FLOOR
    for the table, ENCODER_FLOOR for the encoder's head) at
    which at most `max_false` (MAX_FALSE_BY's share for a category it names) of the benign training
    prompts reach it, judged out of fold;
    `sexual_with_minor`, the lowest (from 0.2) that at most `max_false` of the benign prompts naming
    a minor (by the lists) reach in "sexual"; and `hate_with_group`, the lowest (from its `floor`, or
    hate's threshold if higher) that at most `max_false` of the benign prompts naming a group reach
    in "hate". A share, not the single worst prompt: with a few hundred such prompts, the worst one
    alone moved a threshold by 0.1 each time prompts were added (one Muslim family before a mosque
    in Seoul took hate beside a group from 0.8 to 0.85; hate on heldout-4 fell 0.917 -> 0.886)."""
    present = np.unique(y)
    folds = folds_of(y)
    probs = np.zeros((len(y), len(present)))
    for k, model in enumerate(fold_models):
        probs[folds == k] = model.predict_proba(x[folds == k])
    benign = y == 0
    out = {}
    for col, c in enumerate(present):
        if c == 0:
            continue
        for t in np.arange(floor.get(CLASSES[c], 0.5), 0.951, 0.05):
            if (probs[benign, col] >= t).mean() <= MAX_FALSE_BY.get(CLASSES[c], max_false):
                out[CLASSES[c]] = round(float(t), 2)
                break
        else:
            out[CLASSES[c]] = 0.95
    col = list(present).index(CLASSES.index("sexual"))
    out["sexual_with_minor"] = _above(probs[benign & minors, col], 0.2, max_false)
    # A people named (Muslim, Jewish, Roma) is where the model mistakes a mention for an attack:
    # there "hate" counts from a higher threshold, chosen on the benign prompts that name one.
    col = list(present).index(CLASSES.index("hate"))
    out["hate_with_group"] = _above(probs[benign & groups, col], max(out["hate"], floor["hate_with_group"]),
                                    max_false)
    return out


def _above(benign: np.ndarray, start: float, max_false: float) -> float:
    """The lowest threshold on the 0.05 grid from `start` that more than `max_false` of the
    `benign` probabilities do not reach (those strictly above it count); 1.0 (never reached) when
    even 0.95 is not enough."""
    for t in np.arange(start, 0.951, 0.05):
        if (benign > t).mean() <= max_false if len(benign) else True:
            return round(float(t), 2)
    return 1.0


def build(out_dir: Path, max_false: float = MAX_FALSE, folder: Path = TRAINING, teacher: Path = TEACHER) -> dict:
    from safetensors.numpy import save_file
    from scipy.sparse import csr_matrix, hstack

    rows = read(folder)
    leet = lists.load(("en",)).leet
    features = Features()
    y = np.array([CLASSES.index(r["cat"]) for r in rows])
    tokenizer = MeaningTable.read_tokenizer(teacher / TEACHER_TOKENIZER)
    targets = teacher_embeddings(rows, teacher)
    held_back = read(folder / "held-back") if TABLE_HELD_BACK and (folder / "held-back").is_dir() else []
    extra = (pieces(held_back, tokenizer), teacher_embeddings(held_back, teacher)) if held_back else None
    table, meaning = meaning_features(pieces(rows, tokenizer), targets, folds_of(y), extra)
    fit_cosine = float((meaning * targets / np.linalg.norm(targets, axis=1, keepdims=True)).sum(axis=1).mean())
    # Centred: every prompt's meaning shares one large component (the teacher's embeddings all lie in
    # a narrow cone, and the prefix is in each), which would otherwise do the intercept's work.
    center = meaning.mean(axis=0) if TABLE_CENTER else np.zeros(meaning.shape[1])
    weight = np.array([MeaningTable.weight(len(words_of(r["prompt"], leet)), TABLE_FULL_WORDS) for r in rows])
    x = hstack([matrix(rows, features, leet), csr_matrix((meaning - center) * (TABLE_SCALE * weight[:, None]))]).tocsr()
    model, fold_models = fit_all(x, y)
    from safety.config import PolicyConfig
    from safety.policy.prompt_policy import PromptPolicy

    lists_only = PromptPolicy.load(PolicyConfig(learned=False))
    found = [lists_only.find(r["prompt"]).kinds for r in rows]
    minors = np.array([bool(f.get("sexual_minors", {}).get("minors")) for f in found])
    groups = np.array([bool(f.get("hate", {}).get("groups")) for f in found])
    # The encoder's head: the same prompts as the teacher itself reads them, the same fit and the
    # same rule for its thresholds.
    head, head_folds = fit_all(targets.astype(np.float32), y)
    head_thresholds = thresholds(targets.astype(np.float32), y, head_folds, max_false, minors, groups, ENCODER_FLOOR)
    hashed = 1 << features.bits
    w = model.coef_.T  # features x classes: the hashed ones, then the meaning's
    seen = np.unique(x.indices[x.indices < hashed])
    save_file({"index": seen.astype(np.int32), "weight": w[seen].astype(np.float16),
               "bias": model.intercept_.astype(np.float32), **quantised_table(table),
               "table_center": center.astype(np.float32),
               "table_weight": w[hashed:].astype(np.float32),
               "encoder_weight": head.coef_.T.astype(np.float32),
               "encoder_bias": head.intercept_.astype(np.float32)}, str(out_dir / WEIGHTS))
    (out_dir / TOKENIZER).write_bytes((teacher / TEACHER_TOKENIZER).read_bytes())
    card = {
        # The layer changes with its prompts and with their embeddings: its version names both.
        "version": hashlib.sha256((data_digest(folder) + teacher_digest(teacher)).encode()).hexdigest()[:8],
        "policy_digest": lists.load(("en",)).digest,  # the manifest's: lists, forms and these prompts
        "classes": [CLASSES[i] for i in model.classes_],
        "thresholds": thresholds(x, y, fold_models, max_false, minors, groups),
        "features": {"bits": features.bits, "char_min": features.char_min, "char_max": features.char_max},
        "table": {"scale": TABLE_SCALE, "full_words": TABLE_FULL_WORDS, "held_back": len(held_back), "centred": TABLE_CENTER, "ridge": TABLE_RIDGE, "pieces": int(table.shape[0]),
                  "dims": int(table.shape[1]), "out_of_fold_cosine": round(fit_cosine, 4),
                  "teacher": json.loads((teacher / "card.json").read_text(encoding="utf-8"))["teacher"]},
        "encoder": {"classes": [CLASSES[i] for i in head.classes_], "thresholds": head_thresholds,
                    "model": json.loads((teacher / "card.json").read_text(encoding="utf-8"))["teacher"]},
        "built_by": code_digest(),
        "trained_on": {"digest": data_digest(folder), "teacher": teacher_digest(teacher), "prompts": len(rows),
                       "by_class": {c: int((y == i).sum()) for i, c in enumerate(CLASSES)},
                       "languages": sorted({r["lang"] for r in rows})},
        "settings": {"C": C, "benign_weight": BENIGN_WEIGHT, "max_false": max_false, "max_false_by": MAX_FALSE_BY, "floor": FLOOR, "encoder_floor": ENCODER_FLOOR,
                     "solver": "lbfgs"},
    }
    (out_dir / CARD).write_text(json.dumps(card, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return card


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-false", type=float, default=MAX_FALSE, help="the share of benign training prompts a "
                   "threshold may refuse, out of fold")
    p.add_argument("--out", default=str(lists.shipped_dir()))
    p.add_argument("--training", default=str(TRAINING), help="the folder of labelled prompts (*.jsonl)")
    args = p.parse_args(argv)
    card = build(Path(args.out), args.max_false, Path(args.training))
    print(json.dumps({k: card[k] for k in ("thresholds", "encoder", "trained_on")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
