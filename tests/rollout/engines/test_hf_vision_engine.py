"""HFEngine on a tiny random Qwen3-VL with images: logprobs match the model's own full forward (its own mRoPE
positions from `get_rope_index`), batching and the prefix cache change nothing, images key the prefix cache, and a
text-only policy refuses images."""
from __future__ import annotations

import asyncio
import base64
import copy

import pytest
import torch

from rlfactory.envs.tools.digits_image import render_png
from rlfactory.models.tiny import build_tiny_qwen3_vl
from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import SamplingParams
from rlfactory.rollout.images import message_content, prompt_with_images
from rlfactory.tools.images import ImageLimits, decode_image

PAD = 151643
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def picture(text: str, scale: int = 3):
    return decode_image(base64.b64encode(render_png(text, scale)).decode(), "image/png", ImageLimits())


@pytest.fixture(scope="module")
def vl(qwen_tokenizer):
    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    vision = attach_vision(tok, tiny_vision_processor(tok)).rlfactory_vision
    return build_tiny_qwen3_vl(len(tok), seed=3), tok, vision


def prompt(chat: ChatFormat, text: str, images: list) -> tuple[list[int], list]:
    task = {"prompt": text, "images": [{"data_b64": im.data_b64, "mime_type": im.mime_type} for im in images]}
    messages, shown = prompt_with_images(chat, chat.prompt_messages(text), task)
    return chat.prompt_ids(messages, shown), shown


def model_logprobs(model, vision, ids: list[int], out: list[int], images: list, temperature: float) -> torch.Tensor:
    """The model's own forward over prompt + output (its own mRoPE, from mm_token_type_ids)."""
    seq = torch.tensor([ids + out])
    kwargs = {}
    if images:
        pixels, grid = vision.pixel_inputs(images)
        kwargs = {"pixel_values": pixels, "image_grid_thw": grid,
                  "mm_token_type_ids": (seq == vision.image_token_id).int()}
    model.model.rope_deltas = None
    with torch.no_grad():
        logits = model(input_ids=seq, **kwargs).logits[0, len(ids) - 1:-1]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(out)[:, None]).squeeze(1)


async def test_logprobs_with_images_match_the_models_own_forward(vl):
    model, tok, vision = vl
    chat = ChatFormat(tok)
    cases = [prompt(chat, "What number is this?", [picture("42")]),
             prompt(chat, "Add them.", [picture("7", 4), picture("123456", 2)]),
             prompt(chat, "No picture here.", [])]
    engine = HFEngine(model, pad_token_id=PAD, eos_token_ids=[], vision=vision)
    sampled = SamplingParams(temperature=0.8, max_new_tokens=10, seed=5)
    try:
        outs = await asyncio.gather(*(engine.generate(ids, sampled, images=ims) for ids, ims in cases))
    finally:
        await engine.close()
    assert engine.stats.prefill_batches == 1  # images and text prefilled and decoded in one batch
    for (ids, ims), out in zip(cases, outs):
        want = model_logprobs(model, vision, ids, out.token_ids, ims, 0.8)
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4), (torch.tensor(out.logprobs) - want)


async def test_prefix_cache_continues_a_conversation_with_new_images_and_keys_on_them(vl):
    model, tok, vision = vl
    chat = ChatFormat(tok)
    ids, shown = prompt(chat, "What number is this?", [picture("42")])
    results = {}
    for cached in (False, True):
        engine = HFEngine(model, pad_token_id=PAD, eos_token_ids=[], vision=vision, prefix_cache=cached)
        try:
            first = await engine.generate(ids, GREEDY, images=shown)
            tool_image = picture("1999")
            delta = chat.tool_response_delta([{"role": "tool", "content": message_content("see", [tool_image])}],
                                             turn_closed=False, images=[tool_image])
            turn2 = ids + first.token_ids + delta
            second = await engine.generate(turn2, GREEDY, images=shown + [tool_image])
            # same token ids, other pictures: never served from the parked or shared keys/values of the first
            other = [picture("77"), picture("1234")]
            assert [vision.num_tokens(i) for i in other] == [vision.num_tokens(i) for i in shown + [tool_image]]
            third = await engine.generate(turn2, GREEDY, images=other)
            results[cached] = (first, second, third, engine.stats.prefix_cached_tokens)
        finally:
            await engine.close()
    (f0, s0, t0, c0), (f1, s1, t1, c1) = results[False], results[True]
    assert c0 == 0 and c1 == len(ids) + len(f1.token_ids) - 1  # turn 2 continued turn 1's parked keys/values
    for a, b in ((f0, f1), (s0, s1), (t0, t1)):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert t1.logprobs != pytest.approx(s1.logprobs, abs=1e-3)  # the pictures matter to the model
    want = model_logprobs(model, vision, turn2, s1.token_ids, shown + [tool_image], 0.0)
    assert torch.allclose(torch.tensor(s1.logprobs), want, atol=1e-4)


async def test_a_group_shares_its_prompt_only_with_the_same_images(vl):
    model, tok, vision = vl
    chat = ChatFormat(tok)
    ids, shown = prompt(chat, "Which?", [picture("5")])
    other = [picture("8")]
    engine = HFEngine(model, pad_token_id=PAD, eos_token_ids=[], vision=vision, prefix_cache=True)
    try:
        outs = await asyncio.gather(engine.generate(ids, GREEDY, images=shown),
                                    engine.generate(ids, GREEDY, images=shown),
                                    engine.generate(ids, GREEDY, images=other))
    finally:
        await engine.close()
    assert engine.stats.prefix_cached_tokens == len(ids)  # the second sample only
    assert outs[0].token_ids == outs[1].token_ids
    want = model_logprobs(model, vision, ids, outs[2].token_ids, other, 0.0)
    assert torch.allclose(torch.tensor(outs[2].logprobs), want, atol=1e-4)


async def test_a_text_only_policy_refuses_images(vl, tiny_qwen3):
    _, tok, _vision = vl
    ids, shown = prompt(ChatFormat(tok), "What number is this?", [picture("42")])
    engine = HFEngine(tiny_qwen3, pad_token_id=PAD, eos_token_ids=[])
    try:
        with pytest.raises(ValueError, match="this policy is text-only"):
            await engine.generate(ids, GREEDY, images=shown)
        assert len((await engine.generate(ids, GREEDY)).token_ids) == 12  # the engine goes on serving
    finally:
        await engine.close()


async def test_a_tiny_qwen2_5_vl_goes_through_the_same_path(qwen_tokenizer):
    """Qwen2.5-VL (14-pixel patches, windowed vision attention, its own rope index) with its own processor
    settings: our mRoPE positions equal its `get_rope_index`, and the engine's logprobs its own forward's."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    from rlfactory.models.vision import VisionProcessor, mrope_positions

    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    processor = Qwen2VLImageProcessorPil(patch_size=14, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                         image_std=[0.5] * 3, size={"shortest_edge": 28 * 28,
                                                                    "longest_edge": 28 * 28 * 64})
    vision = attach_vision(tok, VisionProcessor(processor, tok)).rlfactory_vision
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, window_size=112,
                           fullatt_block_indexes=[1]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    ids, shown = prompt(ChatFormat(tok), "Add them.", [picture("123456", 2), picture("7", 4)])
    grids = [vision.grid(im) for im in shown]
    seq = torch.tensor([ids])
    theirs, _ = model.model.get_rope_index(seq, mm_token_type_ids=(seq == vision.image_token_id).int(),
                                           image_grid_thw=torch.tensor(grids))
    assert torch.equal(mrope_positions(ids, grids, vision.image_token_id, 2), theirs[:, 0]) and grids[0] != grids[1]
    engine = HFEngine(model, pad_token_id=PAD, eos_token_ids=[], vision=vision)
    try:
        out = await engine.generate(ids, SamplingParams(temperature=0.8, max_new_tokens=8, seed=1), images=shown)
    finally:
        await engine.close()
    want = model_logprobs(model, vision, ids, out.token_ids, shown, 0.8)
    assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)
