"""The policy's learned layer: what word lists cannot see (paraphrase, euphemism, metaphor, slang).

A linear model over hashed features of the prompt as the lists read it (normalised, transliterated,
leetspeak undone): its words, pairs of words, and the 3- to 5-letter pieces of each word, which
carry inflections and compounds across languages. Softmax over benign and the categories the
training prompts hold (sexual content with minors is the lists' rule, not a class here); how a
probability counts in the policy is the engine's (PromptPolicy._learn).

The weights (safety/policy/lists/learned.safetensors) and their card (learned.json: classes,
thresholds, feature settings, the policy digest it was built for) are built at install by `make
policy-model` (release/policy_train.py) from the labelled prompts in safety/policy/training/, the same
bytes each time; they are not kept in git. A layer built for other lists or prompts stops start-up.
Scoring takes numpy and zlib: about 0.1-0.3 ms a prompt.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from safety.verdicts import SafetyLoadError

WEIGHTS = "learned.safetensors"
CARD = "learned.json"


@dataclass(frozen=True)
class Features:
    """How a prompt's words become feature ids: the same code at training and at serving."""

    bits: int = 16
    char_min: int = 3
    char_max: int = 5

    def ids(self, words: list[str]) -> np.ndarray:
        mask = (1 << self.bits) - 1
        out = set()
        for i, w in enumerate(words):
            out.add(zlib.crc32(b"w " + w.encode()) & mask)
            if i:
                out.add(zlib.crc32(f"b {words[i - 1]} {w}".encode()) & mask)
            padded = f"<{w}>"
            for n in range(self.char_min, self.char_max + 1):
                for j in range(len(padded) - n + 1):
                    out.add(zlib.crc32(b"c " + padded[j:j + n].encode()) & mask)
        return np.fromiter(sorted(out), dtype=np.int64, count=len(out))


class LearnedLayer:
    def __init__(self, weights: np.ndarray, bias: np.ndarray, classes: list[str], thresholds: dict[str, float],
                 features: Features, version: str) -> None:
        self.weights, self.bias, self.classes = weights, bias, classes
        self.thresholds = thresholds
        self.features = features
        self.version = version

    @classmethod
    def load(cls, folder: Path, policy_digest: str, threshold: float | None = None) -> "LearnedLayer":
        """The layer built for this version of the policy. Missing, unreadable or built for other
        lists or training prompts, it stops start-up: a policy never runs without the layer it was
        measured with unless the config says so (`learned = false`)."""
        card_path, weights_path = folder / CARD, folder / WEIGHTS
        fix = "build it with `make policy-model` (`make install` does), or set safety.text.policy.learned = false"
        if not card_path.is_file() or not weights_path.is_file():
            raise SafetyLoadError(f"safety.text.policy.learned: no learned layer in {folder}: {fix}")
        from safetensors.numpy import load_file

        try:
            card = json.loads(card_path.read_text(encoding="utf-8"))
            tensors = load_file(str(weights_path))
            features = Features(**card["features"])
            dense = np.zeros((1 << features.bits, len(card["classes"])), dtype=np.float32)
            dense[tensors["index"]] = tensors["weight"].astype(np.float32)
            thresholds = dict(card["thresholds"])
            built_for = card["policy_digest"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SafetyLoadError(f"{weights_path}: cannot load the policy's learned layer: {e}") from e
        if built_for != policy_digest:
            raise SafetyLoadError(f"safety.text.policy.learned: the learned layer in {folder} was built for the "
                                  f"policy {built_for}, not {policy_digest} (lists or training prompts changed): {fix}")
        if threshold is not None:
            thresholds = {c: threshold for c in thresholds}
        return cls(dense, tensors["bias"].astype(np.float32), list(card["classes"]), thresholds, features,
                   card["version"])

    def probabilities(self, words: list[str]) -> dict[str, float]:
        ids = self.features.ids(words)
        if not len(ids):
            return {}
        logits = self.weights[ids].sum(axis=0) / np.sqrt(len(ids)) + self.bias
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return {c: float(v) for c, v in zip(self.classes, p)}
