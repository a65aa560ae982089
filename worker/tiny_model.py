"""A tiny random-weight FLUX pipeline built from the real classes, for the demo and the tests.

Nothing is downloaded: the tokenizers are built from in-memory vocabularies. The folder written by
`save_pretrained` loads through the same `FluxPipeline.from_pretrained` path as the real model.
"""

from __future__ import annotations

import string
from pathlib import Path


def build_tiny_pipeline(seed: int = 0):
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
        axes_dims_rope=(4, 4, 8))
    # Four blocks: the same 8x spatial scale factor as the real VAE.
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[8, 8, 8, 8], latent_channels=4,
        layers_per_block=1, norm_num_groups=4, sample_size=32, shift_factor=0.0609,
        scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)

    clip_vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in string.printable:
        clip_vocab.setdefault(ch, len(clip_vocab))
    for ch in string.ascii_lowercase:
        clip_vocab[ch + "</w>"] = len(clip_vocab)
    # model_max_length=77 like the real CLIP tokenizer; without it the pipeline overflows.
    clip_tok = CLIPTokenizer(vocab=clip_vocab, merges=[], model_max_length=77)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(clip_vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, projection_dim=32, max_position_embeddings=77, bos_token_id=0,
        eos_token_id=1, pad_token_id=1))

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + ch, -1.0) for ch in string.ascii_lowercase]
    pieces += [(ch, -2.0) for ch in string.printable if not ch.isspace()]
    t5_tok = T5Tokenizer(vocab=pieces, extra_ids=8)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(t5_tok), d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))

    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096, shift=3.0)
    pipe = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=clip_tok,
                        text_encoder_2=t5, tokenizer_2=t5_tok, transformer=transformer)
    # Modules built from configs start in train mode: T5's dropout would break seed determinism.
    for module in (transformer, vae, clip, t5):
        module.eval()
    return pipe


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    directory = Path(directory)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    build_tiny_pipeline(seed).save_pretrained(directory)
    return directory
