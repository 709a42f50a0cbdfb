"""Tiny Qwen3 models: the real architecture (`Qwen3ForCausalLM`: GQA, q/k norms, RoPE) at toy width, so that every
code path (HF engine, vLLM engine, training) runs as it would on a real checkpoint. Used by the `tiny-random` model
option, the SFT warm-up's from-scratch model and `rlfactory serve --tiny-random`; and a tiny Qwen3-VL (the same text
stack under a toy vision tower) for `tiny-random-vl`."""
from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# Qwen3's real ids for the tokens a generation loop needs; only set on configs whose vocab contains them.
QWEN3_BOS_ID = 151643  # <|endoftext|>, also Qwen's pad token
QWEN3_EOS_ID = 151645  # <|im_end|>


def tiny_qwen3_config(
    vocab_size: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    rope_theta: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    initializer_range: float = 0.02,
) -> Any:
    """A `Qwen3Config` at toy size; intermediate defaults to 3 x hidden.

    `head_dim` is set on its own, as in real Qwen3 (heads x head_dim need not equal hidden_size): 32 is the
    smallest head size vLLM's CPU attention supports (16 fails with "Unsupported CPU attention configuration").

    Embeddings are untied by default: a random model with tied embeddings greedily repeats its last input token
    (logits ~ h . E with h dominated by that token's embedding), which makes greedy checks meaningless.
    """
    if heads % kv_heads:
        raise ValueError(f"tiny_qwen3_config: heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    has_qwen_ids = vocab_size > QWEN3_EOS_ID
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        max_window_layers=num_layers,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        bos_token_id=QWEN3_BOS_ID if has_qwen_ids else None,
        eos_token_id=QWEN3_EOS_ID if has_qwen_ids else None,
        pad_token_id=QWEN3_BOS_ID if has_qwen_ids else None,
        architectures=["Qwen3ForCausalLM"],
        dtype="float32",
    )


def build_tiny_qwen3(vocab_size: int, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised fp32 `Qwen3ForCausalLM` (eval mode). Same seed, same weights; global RNG untouched.

    `overrides` go to `tiny_qwen3_config` (hidden_size, num_layers, heads, kv_heads, ...).
    """
    config = tiny_qwen3_config(vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.to(torch.float32).eval()


def tiny_qwen3_vl_config(vocab_size: int, hidden_size: int = 64, num_layers: int = 2, heads: int = 4,
                         kv_heads: int = 2, head_dim: int = 32, max_position_embeddings: int = 4096,
                         vision_hidden_size: int = 32, vision_depth: int = 2, vision_heads: int = 2,
                         intermediate_size: int | None = None) -> Any:
    """A `Qwen3VLConfig` at toy size: the Qwen3 text stack above (with multimodal RoPE: the head's 16 rotary
    frequency pairs split 8/4/4 over time, height and width, interleaved as in Qwen3-VL) under a 2-block vision
    tower (16-pixel patches, 2x2 merge: one image token per 32x32 pixels, deepstack from its first block)."""
    from transformers import Qwen3VLConfig

    text = tiny_qwen3_config(vocab_size, hidden_size=hidden_size, num_layers=num_layers, heads=heads,
                             kv_heads=kv_heads, head_dim=head_dim, max_position_embeddings=max_position_embeddings,
                             intermediate_size=intermediate_size)
    text_fields = {k: getattr(text, k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "initializer_range", "pad_token_id")}
    half = head_dim // 2
    text_fields["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0,
                                      "mrope_section": [half // 2, half // 4, half - half // 2 - half // 4],
                                      "mrope_interleaved": True}
    vision = dict(depth=vision_depth, hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                  num_heads=vision_heads, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=hidden_size, num_position_embeddings=64, deepstack_visual_indexes=[0])
    config = Qwen3VLConfig(text_config=text_fields, vision_config=vision, tie_word_embeddings=False)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    if vocab_size > QWEN3_EOS_ID:
        config.text_config.bos_token_id, config.text_config.eos_token_id = QWEN3_BOS_ID, QWEN3_EOS_ID
    return config


def build_tiny_qwen3_vl(vocab_size: int, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised fp32 `Qwen3VLForConditionalGeneration` (eval mode); same seed, same weights."""
    from transformers import Qwen3VLForConditionalGeneration

    config = tiny_qwen3_vl_config(vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
    return model.to(torch.float32).eval()
