"""Model factory: tiny random Qwen3 models for tests and CPU runs, and loading real HF checkpoints.

Tiny models keep the real Qwen3 architecture (`Qwen3ForCausalLM`: GQA, q/k norms, RoPE) at toy
width, so every code path (HF engine, vLLM engine, training) runs exactly as it would on a real checkpoint.
Left out: quantisation, LoRA and sharding (the verl engine owns those at scale).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)

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
    from transformers import Qwen3Config  # noqa: PLC0415

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
    import torch  # noqa: PLC0415
    from transformers import Qwen3ForCausalLM  # noqa: PLC0415

    config = tiny_qwen3_config(vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.to(torch.float32).eval()


def resolve_device(device: Any = None) -> Any:
    """`None`/"auto" -> cuda when available, else cpu."""
    import torch  # noqa: PLC0415

    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


CUDNN_ATTENTION_ENV = "RLFACTORY_CUDNN_ATTENTION"


def avoid_cudnn_attention(device: Any) -> bool:
    """On CUDA, take PyTorch's cuDNN backend out of `scaled_dot_product_attention` (process-wide).

    Returns whether it applies: a CUDA device, and not opted out.

    PyTorch picks cuDNN attention on Hopper GPUs, and cuDNN builds (and JIT-compiles) a plan for every new sequence
    length. A decode step changes the length every time, and so do training batches, so each forward paid for a new
    plan. Measured on an H200 (`bench/hf_decode.py`, a 0.6B-shaped Qwen3, 64 rows): 105 ms a decode step with
    cuDNN attention, 45 ms without. PyTorch then uses flash or memory-efficient attention, which take any length.
    Set RLFACTORY_CUDNN_ATTENTION=1 to leave PyTorch's choice alone.
    """
    import torch  # noqa: PLC0415

    if torch.device(device).type != "cuda" or os.environ.get(CUDNN_ATTENTION_ENV) == "1":
        return False
    if torch.backends.cuda.cudnn_sdp_enabled():
        torch.backends.cuda.enable_cudnn_sdp(False)
        logger.info("cuDNN attention turned off for this process (a new plan per sequence length is slow for "
                    "decoding); set %s=1 to keep it", CUDNN_ATTENTION_ENV)
    return True


def resolve_dtype(dtype: Any) -> Any:
    """"float32" / "bfloat16" / "float16" / a torch.dtype -> torch.dtype."""
    import torch  # noqa: PLC0415

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise RLFactoryError(f"unknown dtype {dtype!r}: use one of {sorted(names)}")
    return names[dtype]


def load_model(path: str | Path, dtype: Any = "float32", device: Any = None) -> Any:
    """Load a causal LM from an HF model directory (or a hub id when online), in eval mode on `device`."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    torch_dtype = resolve_dtype(dtype)
    target = resolve_device(device)
    local = Path(path)
    if local.exists() and not (local / "config.json").exists():
        raise RLFactoryError(f"{local} has no config.json: point `model` at an HF model directory")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    except OSError as e:
        raise RLFactoryError(
            f"could not load model {path!r}: {e}. Use a local HF model directory, or download it first "
            "(huggingface-cli download NAME) when running offline."
        ) from e
    logger.info("loaded %s (%s) on %s", path, torch_dtype, target)
    return model.to(target).eval()
