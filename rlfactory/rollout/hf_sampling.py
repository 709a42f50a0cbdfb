"""Per-row token sampling for the HF engine: temperature, top-k, top-p, per-request seeded generators.

Logprob convention (shared with the vLLM engine): the logprob of the chosen token under the temperature-scaled
distribution `log_softmax(logits / T)`, before top-k/top-p truncation; for greedy (T == 0) it is the plain
`log_softmax(logits)`. That is what a trainer recomputes from a forward pass with the same temperature.
Left out: repetition/frequency penalties, min-p, logit bias (no recipe uses them yet).
"""
from __future__ import annotations

import secrets
from typing import Any

import torch

from rlfactory.rollout.engine import SamplingParams


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """One generator per request: a seeded request samples the same tokens whatever batch it lands in."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else secrets.randbits(63))
    return gen


def _truncate(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside top-k / the top-p nucleus of one row. logp: [V]."""
    vocab = logp.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logp, top_k).values[-1]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, descending=True)
        probs = sorted_logp.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # [V] probability mass strictly above each token
        drop_sorted = mass_before >= top_p  # the top token always survives (mass_before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return logp


def sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[Any]
) -> tuple[list[int], list[float]]:
    """Pick one token per row. logits: [B, V] (any float dtype). Returns (token ids, logprobs), each of length B."""
    logits = logits.float()  # [B, V]
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
    logp = torch.log_softmax(logits / temps[:, None], dim=-1)  # [B, V] temperature-scaled
    chosen = logp.argmax(-1)  # [B] greedy picks (argmax is unchanged by temperature)
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if sampled:
        rows = logp[sampled]  # [R, V] (a copy: truncation below must not touch the reported logprobs)
        for j, i in enumerate(sampled):
            if params[i].top_k > 0 or params[i].top_p < 1.0:
                rows[j] = _truncate(rows[j], params[i].top_k, params[i].top_p)
        # Inverse-CDF sampling: one uniform number per row from that request's own generator, so a seeded request
        # draws the same tokens whatever batch it is in. (CPU cumsum accumulates float32 in double: the CDF is
        # exact to float32 rounding, ~3e-8.)
        cdf = rows.exp().cumsum(-1)  # [R, V]
        uniforms = torch.cat([torch.rand(1, generator=generators[i], device=logits.device) for i in sampled])  # [R]
        picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(1)  # [R]
        chosen[sampled] = picks.clamp(max=logits.shape[-1] - 1)
    token_logp = logp.gather(1, chosen[:, None]).squeeze(1)  # [B]
    return chosen.tolist(), token_logp.tolist()
