"""What the transcript viewer shows of a web episode (issue 38 item 6): the page text the agent read, as its tool
turns (long accessibility trees folded), and with the server's `--view pixels` a screenshot per turn, inline.

Real parts: the web environment MCP server (envs/tools/web.py) as a stdio subprocess with its site server and
headless Chromium, the ToolManager, the Qwen3 tokenizer with the project's text and VL chat templates, the AgentLoop,
the transcript writer and the viewer. The policy is scripted (token ids in, token ids out): it scrolls, then stops.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import os
import sys
from html.parser import HTMLParser
from typing import Any

import pytest
import pytest_asyncio
from PIL import Image

from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.report.transcripts import load_transcripts, save_transcripts
from rlfactory.report.viewer import FOLD_LINES, render_html
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.mcp_configs import ServerConfig, ServerSettings

pytestmark = [pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                 reason="Debian's chromium is not installed (apt-get install chromium)"),
              pytest.mark.asyncio(loop_scope="module")]  # one web server for the file

ACTIONS = ["scroll [down]", "stop [none]"]


class ScriptedBrowsing:
    """Plays `ACTIONS`, one `web.step` call a turn, whatever the page says."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.images_seen: list[int] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None,
                       images: list[Any] | None = None) -> GenerationOutput:
        self.images_seen.append(len(images or []))
        turn = int(request_id.rsplit("#", 1)[1])
        call = json.dumps({"name": "web.step", "arguments": {"action": ACTIONS[turn]}})
        ids = self.tok.encode(f"<tool_call>\n{call}\n</tool_call><|im_end|>", add_special_tokens=False)
        return GenerationOutput(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    async def update_weights(self, state_dict: Any) -> None:
        pass

    async def close(self) -> None:
        pass


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs)["src"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web_tools():
    cfg = ServerConfig("web", "test", "stdio", command=sys.executable,
                       args=("-m", "rlfactory.envs.tools.web", "--max-episodes", "4", "--view", "pixels"),
                       settings=ServerSettings(cache=False, startup_timeout_s=90, tool_timeout_s=90))
    async with ToolManager({"web": cfg}) as tools:
        yield tools


async def _episode(tools: ToolManager, tok: Any, **rollout):
    chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
    policy = ScriptedBrowsing(tok)
    loop = AgentLoop(policy, tools, chat, RolloutConfig(
        max_context_tokens=32768, max_response_tokens=30000, tool_response_max_tokens=8192,
        max_tool_calls_per_turn=1, sampling={"temperature": 1.0, "max_new_tokens_per_turn": 64}, **rollout))
    traj = await loop.run_one({"id": "shop", "prompt": "Do the web task.", "env": {"server": "web", "task_id": 0}},
                              horizon=4)
    assert traj.finish_reason == "env_done", (traj.finish_reason, traj.error)
    return traj, policy


@pytest.mark.slow  # a VL chat over 1280x720 screenshots: the heavier of the two
async def test_the_viewer_shows_the_page_text_and_a_screenshot_per_turn(web_tools, qwen_tokenizer, tmp_path):
    vl_tok = copy.copy(qwen_tokenizer)
    vl_tok.chat_template = vl_chat_template()
    vl_tok = attach_vision(vl_tok, tiny_vision_processor(vl_tok))
    traj, policy = await _episode(web_tools, vl_tok)

    # A screenshot of the start page (the prompt's) and one after each action, each the tab as the agent saw it.
    assert [im.turn for im in traj.images] == [None, 0, 1] and [im.tool for im in traj.images][1:] == ["web.step"] * 2
    assert policy.images_seen == [1, 2]  # the engine was given them
    for im in traj.images:
        with Image.open(io.BytesIO(base64.b64decode(im.data_b64))) as png:
            assert png.format == "PNG" and png.size == (im.width, im.height) == (1280, 720)
    scrolled = traj.tool_calls[0].result
    assert "URL: " in scrolled and "[" in scrolled  # the accessibility tree, ids in brackets

    save_transcripts(tmp_path / "t" / "step_000001.jsonl", [traj])
    (saved,) = load_transcripts(tmp_path / "t")
    page = render_html([saved])
    parser = _Imgs()
    parser.feed(page)
    distinct = {im.sha256 for im in traj.images}
    assert len(parser.srcs) == 3  # a repeated screenshot is drawn again from its first record's bytes
    assert {hashlib.sha256(base64.b64decode(s.split(",", 1)[1])).hexdigest() for s in parser.srcs} == distinct
    assert "1280×720 image/png" in page and "web.step · sha256" in page


async def test_the_page_text_a_text_policy_read_is_its_tool_turn_with_the_screenshot_note(web_tools, qwen_tokenizer):
    traj, policy = await _episode(web_tools, qwen_tokenizer)
    assert traj.images == [] and policy.images_seen == [0, 0]
    # the reset observation (the last prompt message): the note for its screenshot, the task, the page
    prompt = next(m["content"] for m in traj.messages if m["role"] == "user" and "Task: " in m["content"])
    assert prompt.startswith("[image 1280x720 image/png not shown: this model cannot see images]\nTask: ")
    page = render_html([traj])
    assert "<img" not in page
    scrolled, stopped = traj.tool_calls
    observation = scrolled.result.split("\n[image 1280x720", 1)[0]
    assert "URL: " in observation and "not shown: this model cannot see images" in scrolled.result
    # the page text is in the viewer, escaped; a tree this long shows its start with the rest folded
    lines = observation.splitlines()
    assert len(lines) > FOLD_LINES and '<details class="rest">' in page
    assert _escaped(lines[0]) in page and _escaped(lines[-1]) in page
    assert "score=0 done=true" in stopped.result and _escaped(stopped.result) in page


async def test_a_text_policys_run_can_keep_the_screenshots_it_did_not_see_for_the_viewer(web_tools, qwen_tokenizer):
    traj, policy = await _episode(web_tools, qwen_tokenizer, keep_unseen_images=True)
    assert traj.images == [] and policy.images_seen == [0, 0]  # the policy still reads notes only
    assert "not shown: this model cannot see images" in traj.tool_calls[0].result
    assert [(im.turn, im.tool, im.width, im.height) for im in traj.unseen_images] == [
        (None, None, 1280, 720), (0, "web.step", 1280, 720), (1, "web.step", 1280, 720)]
    page = render_html([traj])
    parser = _Imgs()
    parser.feed(page)
    assert len(parser.srcs) == 3 and page.count("not shown to the policy (it read a note)") == 3


def _escaped(text: str) -> str:
    import html

    return html.escape(text, quote=True)
