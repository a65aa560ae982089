"""fp8 goes only where it can gain, without torchao's process-wide Inductor settings. fp8 itself
needs a CUDA device of compute capability 8.9+, so here the layer choice is checked on the full-size
FLUX.1-schnell architecture built on the meta device (no memory), and the call into torchao against
a stand-in of its API."""

from __future__ import annotations

import collections
import sys
import types

import pytest
import torch

from worker.model.architectures import ARCHS
from worker.model.speed import fp8_targets, quantize_fp8


@pytest.fixture(scope="module")
def flux():
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        transformer = FluxTransformer2DModel(**ARCHS["flux.1-schnell"]["transformer"])
    transformer.fuse_qkv_projections()
    return transformer


def kinds(names) -> collections.Counter:
    """transformer_blocks.3.attn.to_qkv -> transformer_blocks.attn.to_qkv, counted."""
    return collections.Counter(".".join(p for p in n.split(".") if not p.isdigit()) for n in names)


def test_fp8_goes_to_the_big_linears_of_every_block(flux):
    chosen = kinds(fp8_targets(flux))
    assert chosen == {
        "transformer_blocks.attn.to_qkv": 19, "transformer_blocks.attn.to_added_qkv": 19,
        "transformer_blocks.attn.to_out": 19, "transformer_blocks.attn.to_add_out": 19,
        "transformer_blocks.ff.net.proj": 19, "transformer_blocks.ff.net": 19,
        "transformer_blocks.ff_context.net.proj": 19, "transformer_blocks.ff_context.net": 19,
        "single_transformer_blocks.attn.to_qkv": 38, "single_transformer_blocks.proj_mlp": 38,
        "single_transformer_blocks.proj_out": 38,
    }


def test_fp8_leaves_out_what_cannot_gain(flux):
    left = kinds(n for n, m in flux.named_modules() if isinstance(m, torch.nn.Linear)) - kinds(fp8_targets(flux))
    # one row per image (adaLN modulation), embedders, the last layer, and the projections fusing replaced
    assert {"transformer_blocks.norm1.linear", "transformer_blocks.norm1_context.linear",
            "single_transformer_blocks.norm.linear", "norm_out.linear", "x_embedder", "context_embedder",
            "time_text_embed.timestep_embedder.linear_1", "proj_out", "transformer_blocks.attn.to_q",
            "transformer_blocks.attn.add_k_proj"} <= set(left)


def test_small_layers_are_left_out(flux):
    from diffusers import FluxTransformer2DModel

    tiny = FluxTransformer2DModel(**ARCHS["tiny"]["transformer"])
    assert fp8_targets(tiny) == []  # every side under 1024
    assert "transformer_blocks.0.attn.to_q" in fp8_targets(tiny, min_features=16)  # not fused here


@pytest.fixture
def torchao(monkeypatch):
    """torchao.quantization's names as the worker uses them, recording each call."""
    calls = []
    api = types.SimpleNamespace(
        Float8DynamicActivationFloat8WeightConfig=lambda **kw: ("config", kw),
        PerRow=lambda: "per-row", PerTensor=lambda: "per-tensor",
        quantize_=lambda model, config, filter_fn: calls.append((model, config, filter_fn)))
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.quantization", api)
    return calls


@pytest.mark.parametrize("scales, granularity", [("row", "per-row"), ("tensor", "per-tensor")])
def test_quantize_keeps_inductor_settings_and_filters_by_name(flux, torchao, scales, granularity):
    summary = quantize_fp8(flux, scales)
    [(model, (_, kw), filter_fn)] = torchao
    assert model is flux and kw == {"granularity": granularity, "set_inductor_config": False}
    modules = dict(flux.named_modules())
    chosen = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear) and filter_fn(m, n)]
    assert chosen == fp8_targets(flux) and summary == f"fp8 per-{scales} on {len(chosen)} linear layers"
