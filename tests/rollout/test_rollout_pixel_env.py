"""An environment with a pixel view through the rollout (issue 39 item 3): BabyAI served with `--view pixels` (a
real MCP subprocess) opens the task's episode before the first turn and every step answers with a picture; a
vision-language policy (a scripted tiny Qwen3-VL behind the HF engine) sees the reset's picture in its prompt and
each step's in the tool turn, image placeholders where the records say; a text-only policy reads a note instead."""
from __future__ import annotations

import copy
import json
import sys

import pytest
from scripted_model import build_scripted_qwen3, build_scripted_qwen3_vl

from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.tools.manager import ToolManager

STEP = '{"name": "step","arguments":{"action":"turn left"}}'  # no token repeats: the script follows the last token
TASK = {"id": "babyai-3", "prompt": "Reach the goal the mission names.", "env": {"server": "babyai", "task_id": 3}}


@pytest.fixture(scope="module")
def vl_tok(qwen_tokenizer):
    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    return attach_vision(tok, tiny_vision_processor(tok))


async def _play(tok, tmp_path, build):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"babyai": {
        "command": sys.executable, "args": ["-m", "rlfactory.envs.tools.babyai", "--view", "pixels"],
        "rlfactory": {"cache": False}}}}))
    async with ToolManager.from_files([config]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas())
        model = build(tok, [(f"<tool_call>{STEP}</tool_call><|im_end|>", 1.0)],
                      start_token_ids=[chat.generation_prompt_ids[-1]], junk_prob=1e-6)
        engine = HFEngine(model, pad_token_id=151643, eos_token_ids=chat.stop_token_ids, vision=chat.vision)
        loop = AgentLoop(engine, tools, chat, RolloutConfig(max_context_tokens=4096, max_response_tokens=1024,
                                                            sampling={"temperature": 1.0}))
        try:
            return await loop.run_one(dict(TASK), horizon=2, seed=0), chat
        finally:
            await engine.close()


async def test_a_vl_policy_sees_the_reset_picture_in_its_prompt_and_each_steps_in_its_tool_turns(vl_tok, tmp_path):
    traj, chat = await _play(vl_tok, tmp_path, build_scripted_qwen3_vl)
    assert traj.error is None and traj.finish_reason == "max_turns", traj.error
    # the reset's, then the first turn's step (the horizon ends the trajectory at the second turn's tool call)
    assert len(traj.images) == 2 and [im.tool for im in traj.images][1:] == ["step"]
    reset, *steps = traj.images
    assert reset.start + reset.tokens <= len(traj.prompt_ids)  # the reset's picture is part of the prompt
    assert all(im.start >= len(traj.prompt_ids) and im.tool == "step" for im in steps)
    full = traj.prompt_ids + traj.response_ids
    for im in traj.images:
        assert full[im.start:im.start + im.tokens] == [chat.vision.image_token_id] * im.tokens
    for im in steps:  # a picture is tool content: never trained
        at = im.start - len(traj.prompt_ids)
        assert traj.loss_mask[at:at + im.tokens] == [0] * im.tokens
    assert "in the picture" in chat.tokenizer.decode(traj.prompt_ids)  # the text keeps the mission, not the view


async def test_a_text_only_policy_reads_a_note_for_the_reset_picture(qwen_tokenizer, tmp_path):
    traj, _ = await _play(qwen_tokenizer, tmp_path, build_scripted_qwen3)
    assert traj.error is None and traj.images == []
    assert "not shown: this model cannot see images" in qwen_tokenizer.decode(traj.prompt_ids)
