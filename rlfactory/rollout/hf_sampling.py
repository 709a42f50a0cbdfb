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
    greedy_ids = logp.argmax(-1)  # argmax is unchanged by temperature
    tokens: list[int] = []
    for i, p in enumerate(params):
        if p.temperature <= 0:
            tokens.append(int(greedy_ids[i]))
            continue
        row = _truncate(logp[i], p.top_k, p.top_p) if (p.top_k > 0 or p.top_p < 1.0) else logp[i]
        # Gumbel-max via exponential noise: argmax(p / E) with E ~ Exp(1) samples from p, using this row's RNG.
        noise = torch.empty_like(row).exponential_(generator=generators[i])
        tokens.append(int(torch.argmax(row.exp() / noise)))
    chosen = torch.tensor(tokens, device=logits.device)
    token_logp = logp.gather(1, chosen[:, None]).squeeze(1)  # [B]
    return tokens, token_logp.tolist()
