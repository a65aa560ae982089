"""Diffusion-transformer pipelines built from configs with random weights, of two families:

- FLUX (FluxPipeline): the tiny one the tests and the demo use, and the full-size FLUX.1-schnell
  architecture (12B transformer, T5-XXL, CLIP-L, the 16-channel VAE) that the benchmark measures
  speed on where no weights can be downloaded;
- PixArt-Sigma (PixArtSigmaPipeline): a tiny one, so that the tests run a second family (a T5 encoder
  only, a 4-channel SD-style VAE, a DPM-Solver++ scheduler, epsilon prediction with learned sigma).

Speed does not depend on the values; the images are noise.

Nothing is downloaded: the tokenizers are built from in-memory vocabularies (token ids stay below
every vocabulary size, so the full-size models accept them).
"""

from __future__ import annotations

import contextlib
import string

ARCHS = {
    "tiny": dict(
        family="flux",
        transformer=dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                         num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                         guidance_embeds=False, axes_dims_rope=(4, 4, 8)),
        # Four blocks: the same 8x spatial scale factor as the real VAE.
        vae=dict(block_out_channels=[8, 8, 8, 8], latent_channels=4, layers_per_block=1, norm_num_groups=4,
                 sample_size=32, shift_factor=0.0609, scaling_factor=1.5035),
        clip=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  projection_dim=32),
        t5=dict(d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4, relative_attention_num_buckets=8),
        scheduler=dict(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                       max_image_seq_len=4096, shift=3.0),
    ),
    # The published configs of black-forest-labs/FLUX.1-schnell.
    "flux.1-schnell": dict(
        family="flux",
        transformer=dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                         num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                         guidance_embeds=False, axes_dims_rope=(16, 56, 56)),
        vae=dict(block_out_channels=[128, 256, 512, 512], latent_channels=16, layers_per_block=2,
                 norm_num_groups=32, sample_size=1024, shift_factor=0.1159, scaling_factor=0.3611),
        clip=dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                  num_attention_heads=12, projection_dim=768, hidden_act="quick_gelu"),
        t5=dict(vocab_size=32128, d_model=4096, d_ff=10240, d_kv=64, num_layers=24, num_heads=64,
                relative_attention_num_buckets=32, feed_forward_proj="gated-gelu"),
        scheduler=dict(use_dynamic_shifting=False, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                       max_image_seq_len=4096, shift=1.0),
    ),
    # PixArt-Sigma's layout (diffusers' scripts/convert_pixart_sigma_to_diffusers.py) at toy width:
    # patch 2 over 4 latent channels, 8 out (learned sigma), no micro-conditions (Sigma has none),
    # sample_size = 256 // 8 with the interpolation scale of the 256 px checkpoint. Other sizes (any
    # multiple of 16) get their position embeddings interpolated; the engine turns resolution
    # binning off so the latents have the size asked for.
    "tiny-pixart": dict(
        family="pixart",
        transformer=dict(sample_size=32, interpolation_scale=0.5, patch_size=2, in_channels=4, out_channels=8,
                         num_layers=2, attention_head_dim=8, num_attention_heads=2, cross_attention_dim=16,
                         caption_channels=32, attention_bias=True, activation_fn="gelu-approximate",
                         num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False,
                         norm_eps=1e-6, use_additional_conditions=False),
        # The SDXL VAE PixArt-Sigma ships with, shrunk: 4 latent channels, quant convs, no shift;
        # four blocks for the same 8x spatial scale factor.
        vae=dict(block_out_channels=[8, 8, 8, 8], latent_channels=4, layers_per_block=1, norm_num_groups=4,
                 sample_size=32, scaling_factor=0.13025),
        t5=dict(d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4, relative_attention_num_buckets=8),
        # The converted checkpoints' scheduler: DPMSolverMultistepScheduler's defaults (DPM-Solver++
        # order 2, linear betas 1e-4..0.02, epsilon prediction). Deterministic: no noise per step.
        scheduler=dict(),
    ),
}


def build_pipeline(arch: str = "tiny", seed: int = 0, dtype=None, device=None):
    """A pipeline of `arch` (a FluxPipeline or a PixArtSigmaPipeline, after its family) with random
    weights drawn from `seed`, its modules built directly on `device` in `dtype` (building the 12B
    transformer on the CPU in float32 first would take minutes and 48 GB) and in eval mode."""
    import torch

    spec = ARCHS[arch]
    torch.manual_seed(seed)
    pipe, modules = {"flux": _flux, "pixart": _pixart}[spec["family"]](spec, dtype, device)
    # Modules built from configs start in train mode: T5's dropout would break seed determinism.
    for module in modules:
        module.eval()
    return pipe


@contextlib.contextmanager
def _building(dtype, device):
    """New modules' weights in `dtype` on `device`; the scheduler and the pipeline are made outside
    (the schedulers' tables stay float32 on the CPU, as from_pretrained makes them)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        with torch.device(device or "cpu"):
            yield
    finally:
        torch.set_default_dtype(previous)


def _flux(spec: dict, dtype, device):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    clip_tok, t5_tok = _tokenizers()
    with _building(dtype, device):
        transformer = FluxTransformer2DModel(**spec["transformer"])
        vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                            up_block_types=["UpDecoderBlock2D"] * 4, use_quant_conv=False,
                            use_post_quant_conv=False, **spec["vae"])
        clip = CLIPTextModel(CLIPTextConfig(**{"vocab_size": len(clip_tok.get_vocab()), **spec["clip"]},
                                            max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
                                            pad_token_id=1))
        t5 = T5EncoderModel(T5Config(**{"vocab_size": len(t5_tok), **spec["t5"]}, decoder_start_token_id=0,
                                     pad_token_id=0, eos_token_id=1))
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**spec["scheduler"]), vae=vae, text_encoder=clip,
                        tokenizer=clip_tok, text_encoder_2=t5, tokenizer_2=t5_tok, transformer=transformer)
    return pipe, (transformer, vae, clip, t5)


def _pixart(spec: dict, dtype, device):
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    _, t5_tok = _tokenizers()
    with _building(dtype, device):
        transformer = PixArtTransformer2DModel(**spec["transformer"])
        # Quant convs kept (use_quant_conv defaults to True), as in the SD/SDXL VAEs.
        vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                            up_block_types=["UpDecoderBlock2D"] * 4, **spec["vae"])
        t5 = T5EncoderModel(T5Config(**{"vocab_size": len(t5_tok), **spec["t5"]}, decoder_start_token_id=0,
                                     pad_token_id=0, eos_token_id=1))
    pipe = PixArtSigmaPipeline(tokenizer=t5_tok, text_encoder=t5, vae=vae, transformer=transformer,
                               scheduler=DPMSolverMultistepScheduler(**spec["scheduler"]))
    return pipe, (transformer, vae, t5)


def _tokenizers():
    from transformers import CLIPTokenizer, T5Tokenizer

    clip_vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in string.printable:
        clip_vocab.setdefault(ch, len(clip_vocab))
    for ch in string.ascii_lowercase:
        clip_vocab[ch + "</w>"] = len(clip_vocab)
    # model_max_length=77 like the real CLIP tokenizer; without it the pipeline overflows.
    clip_tok = CLIPTokenizer(vocab=clip_vocab, merges=[], model_max_length=77)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + ch, -1.0) for ch in string.ascii_lowercase]
    pieces += [(ch, -2.0) for ch in string.printable if not ch.isspace()]
    return clip_tok, T5Tokenizer(vocab=pieces, extra_ids=8)
