"""HFEngine on a tiny random Qwen3: batching never changes results, logprobs match a full forward, stops, seeds."""
from __future__ import annotations

import asyncio

import pytest
import torch

from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import GenerationEngine, SamplingParams

IM_END, PAD = 151645, 151643
PROMPTS = [
    [9707, 11, 1879],
    list(range(1000, 1037)),
    [151644, 872, 198, 3838, 374, 220, 16, 10, 17, 30, 151645, 198, 151644, 77091, 198],
    list(range(70000, 70011)),
    [42],
]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=20)


def make_engine(model, **kw) -> HFEngine:
    # No engine-level EOS here: a random model may emit <|im_end|> anywhere, and these tests want full lengths.
    kw.setdefault("eos_token_ids", [])
    return HFEngine(model, pad_token_id=PAD, device="cpu", **kw)


def full_forward_logprobs(model, prompt: list[int], out: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1]  # [T, V]
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return logp.gather(1, torch.tensor(out)[:, None]).squeeze(1)


async def test_is_a_generation_engine(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    assert isinstance(engine, GenerationEngine)
    await engine.close()


async def test_batched_equals_unbatched_greedy(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    solo = [await engine.generate(p, GREEDY) for p in PROMPTS]
    assert engine.stats.max_batch_rows == 1
    together = await asyncio.gather(*[engine.generate(p, GREEDY) for p in PROMPTS])

    async def late(i: int, prompt: list[int]):  # joins a batch that is already decoding (continuous batching)
        for _ in range(i * 3):
            await asyncio.sleep(0.002)
        return await engine.generate(prompt, GREEDY)

    staggered = await asyncio.gather(*[late(i, p) for i, p in enumerate(PROMPTS)])
    await engine.close()
    for a, b, c in zip(solo, together, staggered):
        assert len(a.token_ids) == 20 and a.finish_reason == "length"
        assert b.token_ids == a.token_ids
        assert c.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert len(set(solo[0].token_ids)) > 5  # the model does not just repeat a token: the check has teeth


async def test_logprobs_match_full_forward(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    sampled = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=16, seed=11)
    outs = await asyncio.gather(*[engine.generate(p, sampled) for p in PROMPTS])
    greedy = await asyncio.gather(*[engine.generate(p, GREEDY) for p in PROMPTS])
    await engine.close()
    for prompt, out in zip(PROMPTS, outs):
        want = full_forward_logprobs(tiny_qwen3, prompt, out.token_ids, 0.7)
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)
    for prompt, out in zip(PROMPTS, greedy):
        want = full_forward_logprobs(tiny_qwen3, prompt, out.token_ids, 0.0)
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)


async def test_stop_tokens_are_respected_and_included(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    reference = (await engine.generate(PROMPTS[1], GREEDY)).token_ids
    stop = reference[7]
    first = reference.index(stop)
    out = await engine.generate(PROMPTS[1], GREEDY.model_copy(update={"stop_token_ids": [stop]}))
    assert out.token_ids == reference[:first + 1] and out.finish_reason == "stop"
    await engine.close()
    # Engine-level EOS ids stop every request too.
    eos_engine = make_engine(tiny_qwen3, eos_token_ids=[stop])
    out = await eos_engine.generate(PROMPTS[1], GREEDY)
    assert out.token_ids == reference[:first + 1] and out.finish_reason == "stop"
    await eos_engine.close()


async def test_stop_strings(tiny_qwen3, qwen_tokenizer):
    engine = make_engine(tiny_qwen3, tokenizer=qwen_tokenizer)
    reference = (await engine.generate(PROMPTS[0], GREEDY)).token_ids
    stop_text = next(t for t in (qwen_tokenizer.decode([i]) for i in reference[4:]) if t.strip())
    out = await engine.generate(PROMPTS[0], GREEDY.model_copy(update={"stop_strings": [stop_text]}))
    await engine.close()
    assert out.finish_reason == "stop"
    assert out.token_ids == reference[:len(out.token_ids)]
    assert stop_text in qwen_tokenizer.decode(out.token_ids)
    assert stop_text not in qwen_tokenizer.decode(out.token_ids[:-1])
    with pytest.raises(ValueError, match="tokenizer"):
        await make_engine(tiny_qwen3).generate([1], SamplingParams(stop_strings=["x"]))


async def test_seeds_reproduce_whatever_the_batch(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    params = [SamplingParams(temperature=1.0, max_new_tokens=12, seed=s) for s in range(len(PROMPTS))]
    solo = [await engine.generate(p, sp) for p, sp in zip(PROMPTS, params)]
    together = await asyncio.gather(*[engine.generate(p, sp) for p, sp in zip(PROMPTS, params)])
    reseeded = await engine.generate(PROMPTS[0], params[0].model_copy(update={"seed": 1234}))
    await engine.close()
    assert [o.token_ids for o in together] == [o.token_ids for o in solo]
    assert reseeded.token_ids != solo[0].token_ids


async def test_concurrent_requests_are_batched(tiny_qwen3):
    engine = make_engine(tiny_qwen3, batch_wait_ms=20)
    n = 12
    outs = await asyncio.gather(*[
        engine.generate(PROMPTS[i % len(PROMPTS)], SamplingParams(temperature=1.0, max_new_tokens=8, seed=i))
        for i in range(n)])
    await engine.close()
    assert all(len(o.token_ids) == 8 for o in outs)
    assert engine.stats.requests == n
    assert engine.stats.prefill_batches < n
    assert engine.stats.max_batch_rows > 1
    assert engine.stats.generated_tokens == 8 * n


async def test_max_batch_size_caps_rows(tiny_qwen3):
    engine = make_engine(tiny_qwen3, max_batch_size=2)
    outs = await asyncio.gather(*[engine.generate(p, GREEDY) for p in PROMPTS])
    await engine.close()
    assert engine.stats.max_batch_rows <= 2
    assert all(len(o.token_ids) == 20 for o in outs)


async def test_event_loop_keeps_running_while_generating(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    ticks = 0
    task = asyncio.ensure_future(engine.generate(PROMPTS[1], SamplingParams(temperature=0, max_new_tokens=60)))
    while not task.done():
        ticks += 1
        await asyncio.sleep(0)
    await engine.close()
    assert len(task.result().token_ids) == 60
    assert ticks > 10  # the model ran in the worker thread, not on the loop


async def test_cancelled_request_leaves_the_batch(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    doomed = asyncio.ensure_future(engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=500)))
    survivor = asyncio.ensure_future(engine.generate(PROMPTS[1], GREEDY))
    await asyncio.sleep(0.05)
    doomed.cancel()
    out = await survivor
    with pytest.raises(asyncio.CancelledError):
        await doomed
    after = await engine.generate(PROMPTS[1], GREEDY)
    await engine.close()
    assert out.token_ids == after.token_ids


async def test_update_weights(tiny_qwen3, qwen_tokenizer):
    policy = build_tiny_qwen3(len(qwen_tokenizer), seed=0)
    other = build_tiny_qwen3(len(qwen_tokenizer), seed=1)
    engine = make_engine(policy)
    before = await engine.generate(PROMPTS[0], GREEDY)
    await engine.update_weights(policy.state_dict())  # its own tensors: a no-op
    assert (await engine.generate(PROMPTS[0], GREEDY)).token_ids == before.token_ids
    await engine.update_weights(other.state_dict())
    after = await engine.generate(PROMPTS[0], GREEDY)
    await engine.close()
    expected = make_engine(other)
    want = await expected.generate(PROMPTS[0], GREEDY)
    await expected.close()
    assert after.token_ids != before.token_ids
    assert after.token_ids == want.token_ids


async def test_rejects_bad_requests(tiny_qwen3):
    engine = make_engine(tiny_qwen3)
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], GREEDY)
    with pytest.raises(ValueError, match="context"):
        await engine.generate([1] * 5000, GREEDY)
    empty = await engine.generate([1, 2], SamplingParams(max_new_tokens=0))
    assert empty.token_ids == [] and empty.finish_reason == "length"
    await engine.close()
    with pytest.raises(RuntimeError, match="close"):
        await engine.generate([1], GREEDY)


def test_worker_cpus_pin_the_decoding_thread_only():
    import os

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux and 2 CPUs")
    mine = os.sched_getaffinity(0)
    cpu = max(mine)

    async def run() -> set[int]:
        engine = HFEngine(build_tiny_qwen3(300, seed=0), pad_token_id=0, eos_token_ids=[1])
        engine.worker_cpus = {cpu}
        try:
            await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3, seed=0))
            return os.sched_getaffinity(engine._worker.native_id)
        finally:
            await engine.close()

    assert asyncio.run(run()) == {cpu}
    assert os.sched_getaffinity(0) == mine  # the caller's thread keeps its CPUs
