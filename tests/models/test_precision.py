"""`model.compute_dtype` (models/precision.py): forward passes of the engine and the update run under autocast to
bfloat16 with float32 weights, give logprobs close to float32 ones and gradients that train; `auto` takes
bfloat16 only on CPUs with native bfloat16 matmuls (AMX or AVX-512 BF16)."""
from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from rlfactory.algorithms.grpo import build_batch, response_logprobs
from rlfactory.models.precision import (
    autocast,
    compute_dtype_of,
    cpu_has_fast_bf16,
    resolve_compute_dtype,
    set_compute_dtype,
)
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import SamplingParams
from rlfactory.rollout.trajectory import Trajectory


def test_names_resolve():
    assert resolve_compute_dtype("none", "cpu") is None
    assert resolve_compute_dtype("bfloat16", "cpu") is torch.bfloat16
    assert resolve_compute_dtype("auto", "cpu") is (torch.bfloat16 if cpu_has_fast_bf16() else None)
    assert resolve_compute_dtype("auto", "cuda") is None  # on a GPU, model.dtype: bfloat16 is the knob
    with pytest.raises(ValueError, match="model.compute_dtype"):
        resolve_compute_dtype("fp8", "cpu")


def test_the_context_follows_the_model_and_its_copies():
    model = build_tiny_qwen3(300, seed=0)
    assert compute_dtype_of(model) is None
    with autocast(model):
        assert not torch.is_autocast_enabled("cpu")
    set_compute_dtype(model, torch.bfloat16)
    ref = copy.deepcopy(model)  # a KL reference is a deep copy
    for m in (model, ref):
        with autocast(m):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is torch.bfloat16
    assert next(model.parameters()).dtype is torch.float32  # the weights stay as they are


def _generate(model, prompts, seed=0):
    async def run():
        engine = HFEngine(model, pad_token_id=0, eos_token_ids=[1])
        try:
            return [await engine.generate(p, SamplingParams(max_new_tokens=12, seed=seed + i))
                    for i, p in enumerate(prompts)]
        finally:
            await engine.close()
    return asyncio.run(run())


def test_bf16_logprobs_are_close_to_float32_and_the_update_gets_gradients():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 300, (6 + 3 * i,), generator=g).tolist() for i in range(3)]
    fp32 = build_tiny_qwen3(300, seed=0)
    bf16 = set_compute_dtype(copy.deepcopy(fp32), torch.bfloat16)
    outs = _generate(bf16, prompts)
    trajs = [Trajectory(id=str(i), group_id="g", prompt_ids=p, response_ids=o.token_ids,
                        loss_mask=[1] * len(o.token_ids), logprobs=o.logprobs, reward=float(i))
             for i, (p, o) in enumerate(zip(prompts, outs))]
    batch = build_batch(trajs, pad_id=0)
    mask = batch.response_mask.bool()
    with torch.no_grad():
        lp32, _ = response_logprobs(fp32, batch)
    bf16.train()
    lp16, _ = response_logprobs(bf16, batch)
    assert lp16.dtype is torch.float32
    assert (lp16.detach()[mask] - lp32[mask]).abs().max() < 0.1  # bfloat16 rounding, not another function
    assert (lp16.detach()[mask] - batch.old_log_probs[mask]).abs().max() < 0.1  # the engine's behaviour logprobs
    assert not torch.equal(lp16.detach()[mask], lp32[mask])  # it really ran in bfloat16
    (lp16[mask].sum()).backward()
    grads = [p.grad for p in bf16.parameters()]
    assert all(gr is not None and gr.dtype is torch.float32 for gr in grads)
    assert sum(float(gr.abs().sum()) for gr in grads) > 0
