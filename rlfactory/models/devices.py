"""Device and dtype names, and the CUDA attention-backend choice the engines and the trainer share."""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)


def resolve_device(device: Any = None) -> Any:
    """`None`/"auto" -> cuda when available, else cpu."""
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
    if torch.device(device).type != "cuda" or os.environ.get(CUDNN_ATTENTION_ENV) == "1":
        return False
    if torch.backends.cuda.cudnn_sdp_enabled():
        torch.backends.cuda.enable_cudnn_sdp(False)
        logger.info("cuDNN attention turned off for this process (a new plan per sequence length is slow for "
                    "decoding); set %s=1 to keep it", CUDNN_ATTENTION_ENV)
    return True


def resolve_dtype(dtype: Any) -> Any:
    """"float32" / "bfloat16" / "float16" / a torch.dtype -> torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise RLFactoryError(f"unknown dtype {dtype!r}: use one of {sorted(names)}")
    return names[dtype]
