"""The [speed] switches that run on a CPU give the same images (within 1/255) as none; torch.compile
is exercised once (slow: about 40 s cold on 2 cores)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.config import ModelConfig, SpeedConfig
from worker.model.engine import Engine
from worker.model.job import Job

JOBS = [Job(task_id=f"t{i}", prompt=f"a red kite over dunes {i % 2}", width=128, height=128, steps=4, seed=i,
            output_format="png") for i in range(3)]


def model(tiny_model) -> ModelConfig:
    return ModelConfig(source=str(tiny_model), dtype="float32", device="cpu", max_sequence_length=64)


@pytest.fixture(scope="module")
def plain(tiny_model):
    engine = Engine.load(model(tiny_model), torch.device("cpu"))
    return [engine.generate(j).pixels for j in JOBS]


def assert_close(pictures, plain):
    for got, want in zip(pictures, plain):
        assert int(np.abs(got.pixels.astype(int) - want.astype(int)).max()) <= 1


def test_fused_qkv_channels_last_and_native_attention(tiny_model, plain):
    cfg = SpeedConfig(fuse_qkv=True, channels_last_vae=True, attention_backend="native")
    engine = Engine.load(model(tiny_model), torch.device("cpu"), cfg)
    assert all(getattr(m, "fused_projections", True) for m in engine.pipe.transformer.modules()
               if hasattr(m, "fused_projections"))
    assert engine.pipe.vae.decoder.conv_in.weight.is_contiguous(memory_format=torch.channels_last)
    assert_close(engine.generate_batch(JOBS).pictures, plain)


def test_prompt_cache_skips_the_text_encoders_for_repeated_prompts(tiny_model, plain):
    engine = Engine.load(model(tiny_model), torch.device("cpu"), SpeedConfig(prompt_cache_size=1))
    calls = []
    encode = engine.pipe.encode_prompt
    # The pipeline calls encode_prompt too, with the embeddings given (prompt None): not counted.
    engine.pipe.encode_prompt = lambda **kw: (kw["prompt"] and calls.append(kw["prompt"])) or encode(**kw)
    pictures = [engine.generate(j) for j in (JOBS[0], JOBS[2], JOBS[1])]  # prompts 0, 0, 1
    assert calls == [JOBS[0].prompt, JOBS[1].prompt] and engine.prompts.hits == 1
    assert_close(pictures, [plain[0], plain[2], plain[1]])
    engine.generate(JOBS[0])  # evicted by prompt 1 (size 1): encoded again
    assert len(calls) == 3


@pytest.mark.integration  # inductor's compile workers are processes
def test_compiled_transformer_and_vae_decoder(tiny_model, plain):
    cfg = SpeedConfig(compile=True, compile_vae=True)
    engine = Engine.load(model(tiny_model), torch.device("cpu"), cfg)
    assert engine.pipe.transformer._compiled_call_impl is not None
    assert engine.pipe.vae.decoder._compiled_call_impl is not None
    torch._dynamo.utils.counters.clear()
    assert_close(engine.generate_batch(JOBS).pictures, plain)
    # Both really were traced, each once: the first step's noise (drawn on a thread) is an inference
    # tensor like every later step's input, so the transformer is not compiled a second time.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_regional_compile_wraps_each_repeated_block_and_not_the_whole(tiny_model):
    engine = Engine.load(model(tiny_model), torch.device("cpu"), SpeedConfig(compile=True, compile_scope="blocks"))
    transformer = engine.pipe.transformer
    blocks = [*transformer.transformer_blocks, *transformer.single_transformer_blocks]
    assert all(b._compiled_call_impl is not None for b in blocks)  # compiled when first called
    assert transformer._compiled_call_impl is None and transformer.x_embedder._compiled_call_impl is None


def test_compile_text_wraps_both_text_encoders_and_copies_what_it_caches(tiny_model):
    engine = Engine.load(model(tiny_model), torch.device("cpu"), SpeedConfig(compile_text=True, prompt_cache_size=4))
    assert engine.pipe.text_encoder._compiled_call_impl is not None
    assert engine.pipe.text_encoder_2._compiled_call_impl is not None
    assert engine.pipe.transformer._compiled_call_impl is None  # only what was asked
    # A CUDA-graphed encoder reuses its output buffers: the cache must hold copies.
    out = torch.zeros(1, 64, 32), torch.zeros(1, 32)
    engine.pipe.encode_prompt = lambda **kw: (*out, None)
    embeds, pooled = engine.prompts.embed("a kite")
    assert embeds.data_ptr() != out[0].data_ptr() and pooled.data_ptr() != out[1].data_ptr()
