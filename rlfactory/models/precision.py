"""The matmul precision of a loaded policy (`model.compute_dtype`): weights keep `model.dtype`, and every forward pass
(rollout engine, so evaluation too; GRPO update; SFT) runs under `torch.autocast` to the compute dtype.

On CPUs with AMX (Intel Sapphire Rapids and later) bfloat16 matmuls are several times faster than float32 ones.
Measured on the 2-core development machine: 128 x 256 @ 256 x 768 in 72 us against 341 us, 3000 rows in 0.79 ms
against 7.2 ms; a forward/backward of the BabyAI warm start (3.7 M parameters, 32 rows x 400 tokens) in 2.6 s
against 7.2 s. Autocast casts the float32 weights at every forward, which small batches do not repay: a BabyAI
GRPO step (recipes/babyai_learn.yaml, steps 2-6, medians) took 2.17 s against 2.46 s, its rollouts 1.71 s against
1.92 s, but its update 0.32 s against 0.25 s. The larger the model and its batches, the more it gains. Without AMX
(most laptops, AMD) bfloat16 on the CPU is slower than float32: `auto` takes it only where AMX is there. Logits
are cast back to float32 before any softmax, by the callers.

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
def cpu_has_amx() -> bool:
    """Whether this CPU runs bfloat16 matmuls on AMX tiles (as PyTorch's CPU capability reports it)."""
    try:
        return "AMX" in str(torch.backends.cpu.get_cpu_capability()).upper() or _flags_have_amx()
    except Exception:
        return False


def _flags_have_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_bf16" in line.split()
    except OSError:
        pass
    return False


def resolve_compute_dtype(name: str, device: Any) -> torch.dtype | None:
    """`model.compute_dtype` -> the autocast dtype, or None for the weights' own. `auto`: bfloat16 on a CPU with
    AMX, else none (on a GPU set `model.dtype: bfloat16` instead)."""
    if name == "none":
        return None
    if name == "bfloat16":
        return torch.bfloat16
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cpu" and cpu_has_amx() else None
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
