"""`rlfactory_sdpa` (models/attention.py): the models rlfactory loads use it, and it gives the numbers of
transformers' `sdpa` (logits, gradients, and cached decoding with a padding mask) without repeating key/value heads."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from rlfactory.models.attention import NAME, use_gqa_attention
from rlfactory.models.loading import load_model
from rlfactory.models.tiny import build_tiny_qwen3


@pytest.fixture
def pair():
    base = build_tiny_qwen3(300, seed=0)
    assert base.config._attn_implementation == "sdpa"
    assert base.config.num_key_value_heads < base.config.num_attention_heads  # grouped-query attention
    return base, use_gqa_attention(copy.deepcopy(base))


def _batch(rows: int = 4, length: int = 12):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding in some rows
    mask[3, :9] = 0
    return ids, mask


def test_the_same_logits_and_gradients_as_sdpa(pair):
    base, gqa = pair
    assert gqa.config._attn_implementation == NAME
    ids, mask = _batch()
    outs = []
    for model in (base, gqa):
        model.train()
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.log_softmax(-1)[..., 7].mul(mask).sum().backward()
        outs.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(outs[0][0], outs[1][0])
    for a, b in zip(outs[0][1], outs[1][1]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_cached_decoding_with_a_padding_mask_matches(pair):
    base, gqa = pair
    ids, mask = _batch()
    steps = []
    for model in (base, gqa):
        model.eval()
        with torch.inference_mode():
            cache = DynamicCache()
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            mask2 = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            pos = mask.sum(-1, keepdim=True)
            steps.append(model(input_ids=nxt, attention_mask=mask2, position_ids=pos, past_key_values=cache,
                               use_cache=True).logits)
    assert torch.allclose(steps[0], steps[1], atol=1e-5)


def test_loaded_models_use_it_and_others_are_left_alone(tmp_path):
    build_tiny_qwen3(300, seed=0).save_pretrained(tmp_path)
    assert load_model(tmp_path).config._attn_implementation == NAME
    eager = build_tiny_qwen3(300, seed=0)
    eager.set_attn_implementation("eager")
    assert use_gqa_attention(eager).config._attn_implementation == "eager"


class _KernelDtypes(TorchDispatchMode):
    """Records the dtype of the query each attention kernel (forward and backward) receives."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in str(func):
            self.seen.append((str(func), args[0].dtype))
        return func(*args, **(kwargs or {}))


def test_under_cpu_autocast_attention_runs_in_float32(pair):
    """model.compute_dtype: the projections run in bfloat16, the attention kernels (forward and backward, ~5x slower
    in bfloat16 on CPU) in float32; the logits stay within bfloat16 rounding of float32 ones."""
    _, gqa = pair
    ids, mask = _batch()
    gqa.train()
    ref = gqa(input_ids=ids, attention_mask=mask).logits.detach()
    spy = _KernelDtypes()
    with spy:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = gqa(input_ids=ids, attention_mask=mask).logits
            assert logits.dtype is torch.bfloat16  # the projections did run in bfloat16
        logits.float().log_softmax(-1)[..., 7].mul(mask).sum().backward()
    kernels = {name for name, _ in spy.seen}
    assert any("backward" in k for k in kernels) and any("backward" not in k for k in kernels)
    assert {dtype for _, dtype in spy.seen} == {torch.float32}
    assert torch.allclose(logits.float(), ref, atol=0.1, rtol=0.05)
