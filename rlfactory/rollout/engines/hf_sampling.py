"""Per-row token sampling for the HF engine: temperature, top-k, top-p, per-request seeded generators.

Logprob convention (shared with the vLLM engine): the logprob of the chosen token under the temperature-scaled
distribution `log_softmax(logits / T)`, before top-k/top-p truncation; for greedy (T == 0) it is the plain
`log_softmax(logits)`. That is what a trainer recomputes from a forward pass with the same temperature.

How a row is sampled (inverse CDF): unnormalised probabilities `exp((logits - max) / T)` -> cumulative sum -> one
uniform number from that request's own `torch.Generator` -> `searchsorted`. Every step is row-wise, so a seeded request
draws the same tokens whatever batch it lands in, and one draw per step (not one random number per vocabulary id)
keeps the cost at a few passes over the [B, V] logits. `RowSampler` keeps its [B, V] workspace between steps:
on CPU, page-faulting a fresh 40 MB buffer (64 rows x Qwen's 151,669 ids) costs more than the arithmetic on it.

Truncation keeps ties: top-k keeps every token at least as likely as the k-th; top-p keeps the smallest set of most
likely tokens whose mass reaches top_p (after top-k), plus any token tied with the least likely of them.
Left out: repetition/frequency penalties, min-p, logit bias (no recipe uses them yet).
"""
from __future__ import annotations

import secrets
from typing import Any

import torch

from rlfactory.rollout.engines.protocol import SamplingParams

# Top-p first looks for the nucleus among this many most likely tokens (one topk), and sorts the whole row only when
# the nucleus is larger (flat distributions, e.g. untrained models).
_NUCLEUS_POOL = 1024


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """One generator per request: a seeded request samples the same tokens whatever batch it lands in."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else secrets.randbits(63))
    return gen


def _thresholds(probs: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Smallest probability each row keeps under its top-k / top-p. probs: [R, V] unnormalised. Returns [R]."""
    vocab = probs.shape[-1]
    ks = [k if 0 < k < vocab else vocab for k in top_k]
    # How many of the most likely tokens each row looks at: its k, or the nucleus pool when top-p decides.
    pool = min(vocab, max(min(k, _NUCLEUS_POOL) if p < 1.0 else k for k, p in zip(ks, top_p)))
    vals = torch.topk(probs, pool, dim=-1).values  # [R, pool] descending
    out = torch.empty(len(ks), dtype=probs.dtype, device=probs.device)
    for r, (k, p) in enumerate(zip(ks, top_p)):
        if k == vocab:
            kth = probs.new_zeros(())
        elif k <= pool:
            kth = vals[r, k - 1]
        else:  # a large k under top-p: the k-th value lies beyond the pool
            kth = torch.kthvalue(probs[r], vocab - k + 1).values
        if p >= 1.0:
            out[r] = kth
            continue
        kept = probs[r] * (probs[r] >= kth)  # top-k survivors, ties at the k-th value included  # [V]
        mass = kept.sum()
        row = vals[r, :min(k, pool)]  # [n] descending
        if len(row) < k and row.sum() < p * mass:  # the nucleus reaches past the pool: sort the whole row
            row = torch.sort(kept, descending=True).values[:k]
        mass_before = row.cumsum(-1) - row  # [n] mass strictly above each token; the top token always stays
        last = max(int((mass_before < p * mass).sum()) - 1, 0)
        out[r] = torch.maximum(row[last], kth)
    return out


class RowSampler:
    """Picks one token per row of a logits batch; reuses its workspace across calls (one engine worker thread)."""

    def __init__(self) -> None:
        self._work: torch.Tensor | None = None  # [capacity, V] float32

    def _workspace(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        w = self._work
        if w is None or w.shape[0] < rows or w.shape[1] != vocab or w.device != device:
            self._work = w = torch.empty((max(rows, 0 if w is None else w.shape[0]), vocab), dtype=torch.float32,
                                        device=device)
        return w[:rows]

    def __call__(
        self, logits: torch.Tensor, params: list[SamplingParams], generators: list[Any]
    ) -> tuple[list[int], list[float]]:
        """logits: [B, V] (any float dtype). Returns (token ids, logprobs), each of length B."""
        logits = logits.float()  # [B, V]
        rows, vocab = logits.shape
        device = logits.device
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)  # [B]
        top = logits.amax(-1, keepdim=True)  # [B, 1]
        work = self._workspace(rows, vocab, device)
        torch.sub(logits, top, out=work)  # [B, V] <= 0
        if bool((temps != 1.0).any()):
            work.div_(temps[:, None])
        work.exp_()  # unnormalised probabilities of log_softmax(logits / T); each row's max is 1
        log_norm = work.sum(-1).log()  # [B] before any truncation: the logprob convention

        chosen = torch.zeros(rows, dtype=torch.long, device=device)
        greedy = [i for i, p in enumerate(params) if p.temperature <= 0]
        sampled = [i for i, p in enumerate(params) if p.temperature > 0]
        if greedy:
            idx = torch.tensor(greedy, device=device)
            chosen[idx] = logits.index_select(0, idx).argmax(-1)
        if sampled:
            cut = [i for i in sampled if params[i].top_k > 0 or params[i].top_p < 1.0]
            if cut:
                floor = torch.zeros(rows, device=device)  # [B] rows without truncation keep everything
                if len(cut) == rows:
                    floor = _thresholds(work, [p.top_k for p in params], [p.top_p for p in params])
                else:
                    idx = torch.tensor(cut, device=device)
                    floor[idx] = _thresholds(work.index_select(0, idx), [params[i].top_k for i in cut],
                                             [params[i].top_p for i in cut])
                work.masked_fill_(work < floor[:, None], 0.0)
            idx = torch.tensor(sampled, device=device)
            # CPU cumsum accumulates float32 in double: the CDF is exact to float32 rounding (~3e-8), and a token of
            # probability 0 (truncated) never gets an interval of its own.
            cdf = work.cumsum_(-1).index_select(0, idx) if len(sampled) < rows else work.cumsum_(-1)  # [S, V]
            uniforms = torch.cat([torch.rand(1, generator=generators[i], device=device) for i in sampled])  # [S]
            total = cdf[:, -1:]  # [S, 1]
            picks = torch.searchsorted(cdf, uniforms[:, None] * total, right=True).squeeze(1)  # [S]
            over = picks >= vocab  # u * total rounded up to total: take the last token with probability > 0
            if bool(over.any()):
                picks[over] = (cdf[over] < total[over]).sum(-1)
            chosen[idx] = picks
        token_logp = (logits.gather(1, chosen[:, None]).squeeze(1) - top.squeeze(1)) / temps - log_norm  # [B]
        return chosen.tolist(), token_logp.tolist()

