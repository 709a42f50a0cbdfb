"""Bad images in a rollout never crash it (issue 39 item 2): huge, bomb, corrupt, unsupported, not an image, too
thin for the vision processor, or sent to a text-only policy; each becomes text the model reads, and a task with a
bad prompt image becomes an error trajectory that says why. Real parts: scripted tiny Qwen3 / Qwen3-VL behind the
HF engine, the real MCP servers envs/tools/digits_image.py and tests/tools/servers/image_toolbox.py."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from scripted_model import build_scripted_qwen3, build_scripted_qwen3_vl

from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.tools.manager import ToolManager

TOOLBOX = Path(__file__).resolve().parents[1] / "tools" / "servers" / "image_toolbox.py"
CALLS = {  # written so that no token repeats: the scripted chain follows the last token only
    "digits": '{"name": "render_digits","arguments":{"text":"1987"}}',
    "huge": '{"name":"noise","arguments":{"side":64}}',
    "bomb": '{"name":"bomb","arguments":{"side":12345}}',
    "corrupt": '{"name":"truncated","arguments":{}}',
    "tiff": '{"name":"tiff","arguments":{}}',
    "garbage": '{"name":"not_an_image","arguments":{}}',
    "thin": '{"name":"strip"}',
}
SAYS = {
    "huge": "over this server's max_image_bytes (4096)",
    "bomb": "12345x12345 = 152399025 pixels, over this server's max_image_pixels",
    "corrupt": "is corrupt",
    "tiff": "format TIFF (image/tiff) is not supported",
    "garbage": "not an image in a readable format",
    "thin": "not shown: the model's image processor refused it (absolute aspect ratio must be smaller than 200",
}


def _config(tmp_path) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "digits": {"command": sys.executable, "args": ["-m", "rlfactory.envs.tools.digits_image"]},
        "toolbox": {"command": sys.executable, "args": [str(TOOLBOX)], "rlfactory": {"max_image_bytes": 4096}},
    }}))
    return path


async def _play(tok, tmp_path, build, kind: str, task: dict | None = None):
    async with ToolManager.from_files([_config(tmp_path)]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas())
        script = f"<tool_call>{CALLS[kind]}</tool_call><|im_end|>"
        model = build(tok, [(script, 1.0)], start_token_ids=[chat.generation_prompt_ids[-1]], junk_prob=1e-6)
        engine = HFEngine(model, pad_token_id=151643, eos_token_ids=chat.stop_token_ids, vision=chat.vision)
        loop = AgentLoop(engine, tools, chat, RolloutConfig(max_context_tokens=4096, max_response_tokens=1024,
                                                            sampling={"temperature": 1.0}))
        try:
            return await loop.run_one(task or {"prompt": "Read the picture.", "id": kind}, horizon=2, seed=0), chat
        finally:
            await engine.close()


@pytest.fixture(scope="module")
def vl_tok(qwen_tokenizer):
    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    return attach_vision(tok, tiny_vision_processor(tok))


async def test_a_text_only_policy_reads_that_it_cannot_see_the_image(qwen_tokenizer, tmp_path):
    traj, _ = await _play(qwen_tokenizer, tmp_path, build_scripted_qwen3, "digits")
    assert traj.finish_reason == "max_turns" and traj.error is None
    call = traj.tool_calls[0]
    assert not call.is_error and call.images == [] and traj.images == []
    assert call.result == "[image 81x33 image/png not shown: this model cannot see images]"  # 4 digits, scale 3
    assert call.result in traj.turns[1].text  # in the tool turn the model read


@pytest.mark.parametrize("kind", sorted(SAYS))
async def test_a_bad_image_becomes_text_the_policy_reads(vl_tok, tmp_path, kind):
    traj, chat = await _play(vl_tok, tmp_path, build_scripted_qwen3_vl, kind)
    assert traj.finish_reason == "max_turns" and traj.error is None, traj.error
    call = traj.tool_calls[0]
    assert SAYS[kind] in call.result and SAYS[kind] in traj.turns[1].text
    assert traj.images == [] and call.images == []
    assert chat.vision.image_token_id not in traj.prompt_ids + traj.response_ids
    assert call.error_kind == (None if kind == "thin" else "bad_image")


async def test_a_vl_policy_sees_the_good_image(vl_tok, tmp_path):
    traj, chat = await _play(vl_tok, tmp_path, build_scripted_qwen3_vl, "digits")
    assert traj.finish_reason == "max_turns" and len(traj.images) == 1
    image = traj.images[0]
    assert traj.tool_calls[0].images == [image.sha256] and image.turn == 0 and image.tool == "render_digits"
    full = traj.prompt_ids + traj.response_ids
    assert full[image.start:image.start + image.tokens] == [chat.vision.image_token_id] * image.tokens
    saved = type(traj).model_validate_json(traj.model_dump_json())  # saved trajectories keep what the tool returned
    assert saved.images[0].data_b64 == image.data_b64
    from rlfactory.rollout.metrics import rollout_metrics

    m = rollout_metrics([traj, traj.model_copy(update={"images": []})])
    assert m["rollout/images_mean"] == 0.5 and m["rollout/image_tokens_mean"] == image.tokens / 2


async def test_a_bad_prompt_image_is_an_error_trajectory_not_a_crash(vl_tok, tmp_path):
    task = {"prompt": "What is it?", "id": "bad",
            "images": [{"data_b64": "bm90IGFuIGltYWdl", "mime_type": "image/png"}]}  # base64 of "not an image"
    traj, _ = await _play(vl_tok, tmp_path, build_scripted_qwen3_vl, "digits", task)
    assert traj.finish_reason == "error" and "images[0]" in traj.error and "not an image" in traj.error



def test_a_text_only_policy_reads_a_note_for_a_prompt_picture(qwen_tokenizer, vl_tok):
    import base64

    from rlfactory.envs.tools.digits_image import render_png
    from rlfactory.rollout.images import prompt_with_images

    task = {"prompt": "What number?", "images": [{"data_b64": base64.b64encode(render_png("42")).decode()}]}
    text_chat, vl_chat = ChatFormat(qwen_tokenizer), ChatFormat(vl_tok)
    messages, shown = prompt_with_images(text_chat, text_chat.prompt_messages(task["prompt"]), task)
    note = "[image 45x33 image/png not shown: this model cannot see images]\nWhat number?"
    assert shown == [] and messages[0]["content"] == note
    ids = text_chat.prompt_ids(messages, shown)
    assert note in text_chat.decode(ids) and vl_chat.vision.image_token_id not in ids
    messages, shown = prompt_with_images(vl_chat, vl_chat.prompt_messages(task["prompt"]), task)
    assert len(shown) == 1 and messages[0]["content"][0] == {"type": "image", "image": shown[0].sha256}
