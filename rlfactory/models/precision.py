"""The matmul precision of a loaded policy (`model.compute_dtype`): weights keep `model.dtype`, and every forward pass
(rollout engine, so evaluation too; GRPO update; SFT) runs under `torch.autocast` to the compute dtype.

On CPUs with native bfloat16 matmuls (AMX on Intel Sapphire Rapids and later, AVX-512 BF16 on AMD Zen 4 and later)
bfloat16 matmuls are several times faster than float32 ones. Measured on the 2-core development machines: with AMX,
128 x 256 @ 256 x 768 in 72 us against 341 us, 3000 rows in 0.79 ms against 7.2 ms; on an AMD EPYC with AVX-512
BF16, a quickstart GRPO update (6 real batches, 3.3 M parameters) 0.39-0.42 s against 0.63-0.64 s, its matmuls
3.3x faster. Attention itself runs in float32 (models/attention.py): the CPU attention backward is ~5x slower in
bfloat16. Autocast casts the float32 weights at every forward, which small batches do not repay: a BabyAI GRPO step
(recipes/babyai_learn.yaml, steps 2-6, medians, AMX) took 2.17 s against 2.46 s, its rollouts 1.71 s against
1.92 s, but its update 0.32 s against 0.25 s. The larger the model and its batches, the more it gains. Without
native bfloat16 (most laptops, older AMD) bfloat16 on the CPU is slower than float32: `auto` takes it only where
AMX or AVX-512 BF16 is there. Logits are cast back to float32 before any softmax, by the callers.

The engine's behaviour logprobs and the trainer's then differ by bfloat16 rounding (batch shapes differ too): the
PPO ratio of an on-policy token is no longer exactly 1, as on a GPU trained in bfloat16.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

ATTRIBUTE = "rlf_compute_dtype"
"""The attribute of a loaded model holding its compute dtype (None: its weights' dtype)."""


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has native bfloat16 matmuls: AMX tiles (as PyTorch's CPU capability reports it) or the
    AVX-512 BF16 instructions (/proc/cpuinfo)."""
    try:
        if "AMX" in str(torch.backends.cpu.get_cpu_capability()).upper():
            return True
    except Exception:
        pass
    return bool(_cpu_flags() & {"amx_bf16", "avx512_bf16"})


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return set()


def resolve_compute_dtype(name: str, device: Any) -> torch.dtype | None:
    """`model.compute_dtype` -> the autocast dtype, or None for the weights' own. `auto`: bfloat16 on a CPU with
    native bfloat16 matmuls (AMX or AVX-512 BF16), else none (on a GPU set `model.dtype: bfloat16` instead)."""
    if name == "none":
        return None
    if name == "bfloat16":
        return torch.bfloat16
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cpu" and cpu_has_fast_bf16() else None
    raise ValueError(f"model.compute_dtype: unknown value {name!r}: use none, bfloat16 or auto")


def set_compute_dtype(model: Any, dtype: torch.dtype | None) -> Any:
    setattr(model, ATTRIBUTE, dtype)
    return model


def compute_dtype_of(model: Any) -> torch.dtype | None:
    return getattr(model, ATTRIBUTE, None)


def autocast(model: Any) -> contextlib.AbstractContextManager:
    """The context every forward pass of `model` runs in (nothing when it has no compute dtype)."""
    dtype = compute_dtype_of(model)
    if dtype is None:
        return contextlib.nullcontext()
    device_type = next(model.parameters()).device.type
    return torch.autocast(device_type, dtype=dtype)
