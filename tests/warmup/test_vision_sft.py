"""The vision quickstart's path to a warm model: demonstrations whose tool result is a picture (the real digits_image
MCP server's `calculator_picture`), a tokenizer with Qwen-VL's image tokens and the Qwen3-VL template, SFT encoding
identical to what the AgentLoop builds for a VL policy (ids, mask and images), a tiny Qwen3-VL trained on it with its
pixels, and the saved folder loading back as a VL policy. Real parts: the MCP server as a subprocess, a real tiny
Qwen3-VL, the real AgentLoop."""
from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from replay_engine import ReplayEngine

from rlfactory.recipe.tools import ToolsConfig

REPO = Path(__file__).resolve().parents[2]
PICTURES = ToolsConfig(mcp_configs=[str(REPO / "mcp_configs" / "vision.json")], servers=["digits_image"])
SYSTEM = ("Use the calculator_picture tool for arithmetic and read its picture. "
          "Give the final answer as <answer>NUMBER</answer>.")


@pytest.fixture(scope="module")
def demos() -> list[dict]:
    from functools import partial

    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.demos import calculator_policy, generate_demos, make_arithmetic_tasks

    async def go():
        async with ToolManager.from_recipe(PICTURES) as manager:
            return await generate_demos(make_arithmetic_tasks(24, seed=3), manager, direct_fraction=0.25, seed=3,
                                        policy=partial(calculator_policy, tool_name="calculator_picture"),
                                        system_prompt=SYSTEM)

    rows, stats = asyncio.run(go())
    assert stats["tool_errors"] == 0 and stats["pictures"] == stats["tool"] > 0
    return rows


@pytest.fixture(scope="module")
def tokenizer(demos):
    from rlfactory.models.vision import attach_vision, tiny_vision_processor
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    tok = build_tokenizer(demos, vocab_size=1024, vision=True)
    return attach_vision(tok, tiny_vision_processor(tok))


def test_picture_demos_hold_the_servers_png_and_answer_the_reference(demos):
    from rlfactory.envs.tools.digits_image import render_png

    tool = [d for d in demos if d["style"] == "tool"]
    for d in tool:
        part, = d["messages"][3]["content"]  # no text: the product is only in the picture
        assert part["type"] == "image" and part["mime_type"] == "image/png"
        assert base64.b64decode(part["data_b64"]) == render_png(d["answer"], 6)  # vision.json draws at scale 6
        assert d["messages"][4]["content"] == f"<answer>{d['answer']}</answer>"
        assert d["messages"][2]["content"].startswith('<tool_call>\n{"name": "calculator_picture"')


def test_vision_tokenizer_keeps_image_tokens_whole_with_the_vl_template(tokenizer):
    from rlfactory.models.vision import vl_chat_template
    from rlfactory.warmup.tokenizer_builder import VISION_TOKENS, check_tokenizer

    assert check_tokenizer(tokenizer) == []
    for tok in VISION_TOKENS:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok
    assert tokenizer.chat_template == vl_chat_template()


def test_sft_encoding_of_pictures_equals_what_the_agent_loop_builds(tokenizer, demos):
    """Replay each demonstration's assistant tokens through the real AgentLoop and the real server: the VL
    trajectory's ids, loss mask and images must equal the SFT encoding."""
    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.sft import encode_example, encode_transcript

    async def go():
        async with ToolManager.from_recipe(PICTURES) as manager:
            chat = ChatFormat(tokenizer, manager.openai_schemas(), system_prompt=SYSTEM)
            for demo in [d for d in demos if d["style"] == "tool"][:6]:
                ids, mask, images = encode_example(chat, demo["messages"])
                assert len(images) == 1 and ids.count(chat.vision.image_token_id) == chat.vision.num_tokens(images[0])
                with pytest.raises(ValueError, match="encode_example"):
                    encode_transcript(chat, demo["messages"])
                turns = [chat.encode(m["content"]) + [chat.im_end_id] for m in demo["messages"]
                         if m["role"] == "assistant"]
                loop = AgentLoop(ReplayEngine(turns), manager, chat, RolloutConfig(samples_per_prompt=1))
                traj = await loop.run_one({"id": demo["id"], "prompt": demo["messages"][1]["content"],
                                           "answer": demo["answer"]})
                assert traj.finish_reason == "stop", traj.error
                assert traj.prompt_ids + traj.response_ids == ids
                assert [0] * len(traj.prompt_ids) + traj.loss_mask == mask
                assert [im.sha256 for im in traj.images] == [im.sha256 for im in images]

    asyncio.run(go())


def test_tiny_vl_sft_trains_the_vision_tower_and_saves_a_vl_policy(tokenizer, demos, tmp_path):
    import torch

    from rlfactory.models.loading import load_model, load_tokenizer_from
    from rlfactory.models.tiny import build_tiny_qwen3_vl
    from rlfactory.models.vision import load_vision_processor
    from rlfactory.recipe.sft import SFTPhase
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.warmup.sft import _batch, _pixel_inputs, encode_example, policy_token_loss, save_model, train_phases

    chat = ChatFormat(tokenizer, demos[0]["tools"], system_prompt=SYSTEM)
    examples = [encode_example(chat, d["messages"]) for d in demos]
    vision = chat.vision
    model = build_tiny_qwen3_vl(len(tokenizer), seed=0)
    model.config.image_token_id = vision.image_token_id
    model.config.vision_start_token_id, model.config.vision_end_token_id = vision.vision_start_id, vision.vision_end_id
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("model.visual.")}
    history = train_phases(model, [(SFTPhase(data="a.jsonl", steps=20, lr=3e-3, warmup_steps=2), examples)],
                           batch_size=8, pad_id=tokenizer.pad_token_id, seed=0, vision=vision)
    first, last = (sum(r["loss"] for r in rows) / 3 for rows in (history[:3], history[-3:]))
    assert last < 0.7 * first, (first, last)
    moved = [n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert len(moved) == len(before)  # the pictures' gradients reach every vision block

    # Positions: a row with a picture gets mRoPE positions (the image's tokens share a temporal position).
    picked = [e for e in examples if e[2]][:2]
    tensors = _batch(picked, tokenizer.pad_token_id)
    extra = _pixel_inputs(picked, tensors[0].shape[1], vision)
    assert extra["position_ids"].shape == (4, 2, tensors[0].shape[1]) and extra["image_grid_thw"].shape == (2, 3)
    with pytest.raises(ValueError, match="image processor"):
        _pixel_inputs(picked, tensors[0].shape[1], None)

    out = save_model(model, tokenizer, tmp_path / "vl")
    assert (out / "preprocessor_config.json").exists()
    loaded_tok = load_tokenizer_from(out)
    loaded_tok_vision = load_vision_processor(out, loaded_tok)
    assert loaded_tok_vision.num_tokens(picked[0][2][0]) == vision.num_tokens(picked[0][2][0])
    loaded = load_model(out, dtype="float32", device="cpu")
    assert type(loaded).__name__ == "Qwen3VLForConditionalGeneration"
    assert loaded.config.image_token_id == vision.image_token_id
    with torch.no_grad():
        a, _ = policy_token_loss(model.eval(), *tensors, **extra)
        b, _ = policy_token_loss(loaded.eval(), *tensors, **extra)
    assert abs(float(a) - float(b)) < 0.05 * float(a) + 0.05  # bf16 weights, same model

    # A GRPO checkpoint of the policy is a VL model folder too (`rlfactory eval --checkpoint` loads it as one).
    from rlfactory.trainer.checkpoint import save_checkpoint

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = save_checkpoint(tmp_path / "run", 1, model=model, optimizer=opt, scheduler=None, state={},
                           tokenizer=tokenizer)
    assert (ckpt / "model" / "preprocessor_config.json").exists()
    assert load_vision_processor(ckpt / "model", load_tokenizer_from(ckpt / "model")).merge_size == vision.merge_size
