"""The HF engine's prefix cache (`HFEngine(prefix_cache=True)`) on a tiny random Qwen3: shared prompts of one prefill
and parked conversations give the tokens and logprobs of prefilling everything, skip the prompt tokens they say
they skip, and never outlive the weights that computed them."""
from __future__ import annotations

import asyncio

import pytest
import torch

from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import SamplingParams
from rlfactory.trainer.asynchronous.weights import SharedWeights

PAD = 151643
PROMPTS = [list(range(1000, 1037)), [151644, 872, 198, 3838, 374, 220, 16, 10, 17, 30, 151645, 198, 151644, 77091],
           list(range(70000, 70011))]
TOOL_TURN = [151645, 198, 151644, 872, 198, 27, 1451, 29, 220, 19, 20, 151645, 198, 151644, 77091, 198]


def engine_for(model, **kw) -> HFEngine:
    return HFEngine(model, pad_token_id=PAD, eos_token_ids=[], device="cpu", **kw)


async def conversation(engine: HFEngine, prompt: list[int], seed: int, turns: int = 3) -> list:
    """Turns as an agent loop asks for them: the whole history so far, a tool turn appended after each output.
    Greedy: a random model's next-token distribution is nearly uniform (logprobs ~ -11.9), so a sampled token moves
    to its neighbour on a last-bit difference between batch shapes, which depend on how the requests interleave."""
    ids, outs = list(prompt), []
    for turn in range(turns):
        out = await engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=6 + 3 * turn,
                                                        seed=seed * 10 + turn))
        outs.append(out)
        ids = ids + out.token_ids + TOOL_TURN[: 4 + 4 * turn]
    return outs


async def group_rollout(model, prefix_cache: bool, samples: int = 4) -> tuple[list, HFEngine]:
    engine = engine_for(model, prefix_cache=prefix_cache)
    # Hold the engine's (re-entrant) condition while every conversation queues its first request: the worker thread
    # waits, so all of them are admitted in one prefill however busy the machine is.
    with engine._cond:
        tasks = [asyncio.ensure_future(conversation(engine, p, g * samples + k))
                 for g, p in enumerate(PROMPTS) for k in range(samples)]
        while len(engine._pending) < len(tasks):
            await asyncio.sleep(0)
    convs = await asyncio.gather(*tasks)
    await engine.close()
    return convs, engine


def assert_same_outputs(a: list, b: list) -> None:
    for conv_a, conv_b in zip(a, b):
        for x, y in zip(conv_a, conv_b):
            assert x.token_ids == y.token_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


async def test_prefix_cache_gives_the_outputs_of_full_prefills(tiny_qwen3):
    plain, off = await group_rollout(tiny_qwen3, prefix_cache=False)
    cached, on = await group_rollout(tiny_qwen3, prefix_cache=True)
    assert_same_outputs(plain, cached)
    assert off.stats.prefix_cached_tokens == 0
    # every turn after the first continued its conversation's parked keys/values ...
    assert on._parked.hits == len(PROMPTS) * 4 * 2
    # ... and each prompt of a group went through the model once: the tokens run plus those spared are all tokens
    assert on.stats.prefill_tokens + on.stats.prefix_cached_tokens == off.stats.prefill_tokens
    shared_first_turns = sum(len(p) for p in PROMPTS) * 3  # 4 samples a prompt, 3 of them spared
    parked = 0
    for conv, prompt in zip(plain, [p for p in PROMPTS for _ in range(4)]):
        ids = list(prompt)
        for turn, out in enumerate(conv[:-1]):
            parked += len(ids) + len(out.token_ids) - 1  # all but the last sampled token were fed
            ids = ids + out.token_ids + TOOL_TURN[: 4 + 4 * turn]
    assert on.stats.prefix_cached_tokens == shared_first_turns + parked


async def test_a_weight_change_in_place_invalidates_parked_conversations(qwen_tokenizer):
    """A model shared with a trainer: an optimizer step changes the tensors in place, and the engine is not told."""
    model = build_tiny_qwen3(len(qwen_tokenizer), seed=0)
    engine = engine_for(model, prefix_cache=True)
    first = await engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=5))
    assert len(engine._parked) == 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    follow = PROMPTS[0] + first.token_ids + TOOL_TURN
    spared = engine.stats.prefix_cached_tokens
    got = await engine.generate(follow, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert engine.stats.prefix_cached_tokens == spared  # nothing reused from the old weights
    await engine.close()
    fresh = engine_for(model, prefix_cache=False)
    want = await fresh.generate(follow, SamplingParams(temperature=0.0, max_new_tokens=8))
    await fresh.close()
    assert got.token_ids == want.token_ids


async def test_update_weights_clears_parked_conversations(qwen_tokenizer):
    model = build_tiny_qwen3(len(qwen_tokenizer), seed=0)
    engine = engine_for(model, prefix_cache=True)
    first = await engine.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=5))
    await engine.update_weights(build_tiny_qwen3(len(qwen_tokenizer), seed=1).state_dict())
    assert len(engine._parked) == 0
    spared = engine.stats.prefix_cached_tokens
    await engine.generate(PROMPTS[1] + first.token_ids + TOOL_TURN, SamplingParams(temperature=0.0, max_new_tokens=4))
    await engine.close()
    assert engine.stats.prefix_cached_tokens == spared


async def test_pushed_weights_keep_conversations_in_flight(qwen_tokenizer):
    """Under an asynchronous run's weight pushes a conversation's next turn continues its parked keys/values (as a
    row in the running batch keeps its own): the new tokens carry the new version."""
    model = build_tiny_qwen3(len(qwen_tokenizer), seed=0)
    trainer_side = build_tiny_qwen3(len(qwen_tokenizer), seed=0)
    weights = SharedWeights.from_model(trainer_side, None, version=0)
    engine = engine_for(model, prefix_cache=True, weight_source=weights)
    first = await engine.generate(PROMPTS[2], SamplingParams(temperature=0.0, max_new_tokens=5))
    with torch.no_grad():
        for p in trainer_side.parameters():
            p.add_(0.05 * torch.randn_like(p))
    weights.publish(trainer_side, 1)
    spared = engine.stats.prefix_cached_tokens
    follow = PROMPTS[2] + first.token_ids + TOOL_TURN
    got = await engine.generate(follow, SamplingParams(temperature=0.0, max_new_tokens=4))
    await engine.close()
    assert engine.policy_version == 1 and got.versions == [1] * 4 and first.versions == [0] * 5
    assert engine.stats.prefix_cached_tokens - spared == len(PROMPTS[2]) + len(first.token_ids) - 1


async def test_finished_rows_leave_the_batch_without_changing_anyone(tiny_qwen3):
    """Rows that finish stay in the running batch until a compaction; the rows still running are unaffected."""
    engine = engine_for(tiny_qwen3)
    lengths = [1, 2, 3, 5, 8, 13, 21, 30]
    solo = [await engine.generate(PROMPTS[i % 3], SamplingParams(temperature=0.0, max_new_tokens=n))
            for i, n in enumerate(lengths)]
    together = await asyncio.gather(*[engine.generate(PROMPTS[i % 3], SamplingParams(temperature=0.0, max_new_tokens=n))
                                      for i, n in enumerate(lengths)])
    await engine.close()
    for a, b, n in zip(solo, together, lengths):
        assert len(b.token_ids) == n
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


async def test_branches_admitted_together_all_continue_their_roots_parked_turn(tiny_qwen3):
    """A branched group: the root's first turn is parked, then its branches ask for the same history with the tool
    turn appended, all at once. Each continues the parked keys/values (one took the entry, the others share it),
    with the outputs of prefilling everything."""
    async def branched(prefix_cache: bool) -> tuple[list, HFEngine]:
        engine = engine_for(tiny_qwen3, prefix_cache=prefix_cache)
        root = await engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=6))
        follow = PROMPTS[0] + root.token_ids + TOOL_TURN
        with engine._cond:  # admitted in one prefill, as branches that left their root at once are
            tasks = [asyncio.ensure_future(engine.generate(follow, SamplingParams(temperature=0.0, max_new_tokens=5,
                                                                                   seed=k))) for k in range(3)]
            while len(engine._pending) < len(tasks):
                await asyncio.sleep(0)
        outs = await asyncio.gather(*tasks)
        await engine.close()
        return outs, engine

    plain, off = await branched(False)
    shared, on = await branched(True)
    for a, b in zip(plain, shared):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    parked = len(PROMPTS[0]) + 6 - 1  # the root's turn, all but its last sampled token
    assert on._parked.hits == 1
    assert on.stats.prefix_cached_tokens == 3 * parked  # every branch continued it
    assert on.stats.prefill_tokens + on.stats.prefix_cached_tokens == off.stats.prefill_tokens
