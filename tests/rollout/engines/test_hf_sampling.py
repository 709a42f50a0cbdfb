"""The HF engine's sampler: the distribution it draws from, top-k/top-p supports, the logprob convention, greedy,
and per-request seeds that give the same tokens whatever batch a request lands in."""
from __future__ import annotations

import math

import pytest
import torch

from rlfactory.rollout.engines.hf_sampling import RowSampler, make_generator
from rlfactory.rollout.engines.protocol import SamplingParams

QWEN_VOCAB = 151_669


def params(temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)


def draw(logits_row: torch.Tensor, p: SamplingParams, rows: int, steps: int, seed: int = 0) -> torch.Tensor:
    """`rows * steps` tokens from one logits row: `rows` seeded requests sampled together for `steps` steps."""
    sampler = RowSampler()
    gens = [make_generator(seed + i, torch.device("cpu")) for i in range(rows)]
    batch = logits_row.expand(rows, -1).contiguous()
    return torch.tensor([tok for _ in range(steps) for tok in sampler(batch, [p] * rows, gens)[0]])


def support(logits_row: torch.Tensor, p: SamplingParams) -> set[int]:
    """Tokens a row may draw, straight from the definitions (sorting the whole row)."""
    probs = torch.softmax(logits_row.double() / p.temperature, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if 0 < p.top_k < len(probs):
        keep &= probs >= torch.sort(probs, descending=True).values[p.top_k - 1]
    if p.top_p < 1.0:
        kept = torch.sort(probs * keep, descending=True).values
        kept = kept / kept.sum()
        inside = (kept.cumsum(0) - kept) < p.top_p  # mass strictly above each token is under top_p
        keep &= probs >= (probs * keep).sum() * kept[inside][-1]
    return set(keep.nonzero().squeeze(1).tolist())


def assert_frequencies(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    n = len(tokens)
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    for i, q in enumerate(probs.tolist()):
        sigma = math.sqrt(n * q * (1 - q))
        assert abs(counts[i] - n * q) <= 5 * sigma + 2, (i, counts[i].item(), n * q)


def test_draws_follow_the_temperature_scaled_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2])
    for temperature in (0.6, 1.0, 1.8):
        tokens = draw(logits, params(temperature), rows=2000, steps=5)
        assert_frequencies(tokens, torch.softmax(logits.double() / temperature, -1))


def test_top_k_keeps_the_k_most_likely_and_their_ties():
    logits = torch.tensor([3.0, 2.5, 2.0, 2.0, 1.0, 0.0, -1.0, 2.0])
    tokens = draw(logits, params(top_k=3), rows=2000, steps=3)
    assert set(tokens.tolist()) == {0, 1, 2, 3, 7} == support(logits, params(top_k=3))  # ids 2, 3, 7 tie
    kept = torch.tensor([0, 1, 2, 3, 7])
    probs = torch.zeros(8, dtype=torch.double)
    probs[kept] = torch.softmax(logits[kept].double(), -1)
    assert_frequencies(tokens, probs)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert set(draw(logits, params(top_p=0.75), rows=500, steps=4).tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.75
    tokens = draw(logits, params(top_p=0.85), rows=2000, steps=4)
    assert set(tokens.tolist()) == {0, 1, 2}
    assert_frequencies(tokens, torch.tensor([0.5, 0.3, 0.15, 0.0], dtype=torch.double) / 0.95)


@pytest.mark.parametrize("p", [params(top_k=40), params(top_p=0.9), params(0.7, top_k=300, top_p=0.6),
                               params(1.3, top_k=5000, top_p=0.5), params(top_p=0.3)])
def test_supports_match_the_definitions_on_a_large_vocabulary(p):
    # A flat random row (like an untrained model's): top-p nuclei hold thousands of tokens, past the topk pool.
    logits = torch.randn(20_000, generator=torch.Generator().manual_seed(3))
    want = support(logits, p)
    tokens = set(draw(logits, p, rows=120, steps=3).tolist())
    assert tokens <= want
    assert len(tokens) > min(50, len(want) // 2)  # draws spread over the support, not stuck on a few tokens


def test_logprobs_are_log_softmax_before_truncation():
    logits = torch.randn(6, QWEN_VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    ps = [params(0.0), params(0.5), params(1.0), params(1.7, top_k=20), params(0.9, top_p=0.5),
          params(1.0, top_k=100, top_p=0.9)]
    gens = [make_generator(i, torch.device("cpu")) for i in range(6)]
    tokens, logprobs = RowSampler()(logits, ps, gens)
    for i, (p, tok, lp) in enumerate(zip(ps, tokens, logprobs)):
        want = torch.log_softmax(logits[i].double() / (p.temperature or 1.0), -1)[tok].item()
        assert lp == pytest.approx(want, abs=1e-4)
    assert tokens[0] == int(logits[0].argmax())


def test_greedy_takes_the_argmax_and_draws_no_random_numbers():
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(1))
    gens = [make_generator(7, torch.device("cpu")) for _ in range(5)]
    before = [g.get_state() for g in gens]
    tokens, _ = RowSampler()(logits, [params(0.0)] * 5, gens)
    assert tokens == logits.argmax(-1).tolist()
    assert all(torch.equal(g.get_state(), s) for g, s in zip(gens, before))


def test_seeded_rows_draw_the_same_tokens_whatever_the_batch():
    """A request's tokens depend on its logits and seed only: not on batch size, position, or its neighbours'
    temperature / truncation / greedy settings, nor on the sampler's reused workspace."""
    torch.manual_seed(5)
    mine = torch.randn(QWEN_VOCAB) * 2
    mine_params = params(0.9, top_p=0.95)
    sampler = RowSampler()

    def run(batch_size: int, position: int, steps: int = 6) -> tuple[list[int], list[float]]:
        gens = [make_generator(1000 + i, torch.device("cpu")) for i in range(batch_size)]
        gens[position] = make_generator(42, torch.device("cpu"))
        others = [params(0.0), params(1.0), params(0.5, top_k=30), params(1.2, top_p=0.7)]
        ps = [others[i % len(others)] for i in range(batch_size)]
        ps[position] = mine_params
        toks, lps = [], []
        for step in range(steps):
            logits = torch.randn(batch_size, QWEN_VOCAB, generator=torch.Generator().manual_seed(step)) * 3
            logits[position] = mine + step
            t, lp = sampler(logits, ps, gens)
            toks.append(t[position])
            lps.append(lp[position])
        return toks, lps

    alone = run(1, 0)
    for batch_size, position in [(7, 3), (33, 32), (2, 0)]:
        toks, lps = run(batch_size, position)
        assert toks == alone[0]
        assert lps == pytest.approx(alone[1], abs=1e-5)
    assert run(1, 0)[0] == alone[0]
