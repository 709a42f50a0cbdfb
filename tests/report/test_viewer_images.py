"""The images a trajectory saw, in its saved transcript and inline in the viewer and the dashboard (issue 39 item 5),
and long tool turns folded. Real parts: the real digits_image MCP server (envs/tools/digits_image.py), a scripted tiny
Qwen3-VL behind the HF engine, the real transcript writer, viewer and dashboard, and headless Chromium decoding the
page's images."""
from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import Browser
from PIL import Image
from scripted_model import build_scripted_qwen3, build_scripted_qwen3_vl

from rlfactory.envs.tools.digits_image import render_png
from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.report.dashboard import Dashboard, make_server
from rlfactory.report.transcript_images import REPEAT, bounded
from rlfactory.report.transcripts import load_transcripts, save_transcripts
from rlfactory.report.viewer import FOLD_LINES, render_html, trajectory_html
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.trajectory import Trajectory, TrajectoryImage, TurnSpan
from rlfactory.tools.manager import ToolManager

CALL = '<tool_call>{"name": "render_digits","arguments":{"text":"1987"}}</tool_call><|im_end|>'
DIGITS = render_png("1987")  # what the server draws for that call (scale 3)


class _Images(HTMLParser):
    """Each <img> of a page with the class of the turn it sits in ("prompt" outside any turn)."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.images: list[tuple[str, dict[str, str]]] = []
        self.details_text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            turn = next((c for c in reversed(self.stack) if c.startswith("turn ")), "prompt")
            self.images.append((turn, a))
        elif tag not in ("br", "meta", "input"):
            self.stack.append(a.get("class") or "")

    def handle_endtag(self, tag):
        if tag != "img" and self.stack:
            self.stack.pop()


def _images(page: str) -> list[tuple[str, dict[str, str]]]:
    p = _Images()
    p.feed(page)
    return p.images


def _bytes_of(src: str) -> bytes:
    head, data = src.split(",", 1)
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


@pytest.fixture(scope="module")
def vl_tok(qwen_tokenizer):
    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    return attach_vision(tok, tiny_vision_processor(tok))


async def _play(tok, tmp_path, build, horizon: int, **rollout) -> Trajectory:
    """`horizon - 1` turns that each call render_digits("1987") on the real server (the same picture each time)."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "digits": {"command": sys.executable, "args": ["-m", "rlfactory.envs.tools.digits_image"]}}}))
    async with ToolManager.from_files([config]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas())
        model = build(tok, [(CALL, 1.0)], start_token_ids=[chat.generation_prompt_ids[-1]], junk_prob=1e-6)
        engine = HFEngine(model, pad_token_id=151643, eos_token_ids=chat.stop_token_ids, vision=chat.vision)
        loop = AgentLoop(engine, tools, chat, RolloutConfig(max_context_tokens=4096, max_response_tokens=1024,
                                                            sampling={"temperature": 1.0}, **rollout))
        try:
            return await loop.run_one({"prompt": "Read the picture.", "id": "digits"}, horizon=horizon, seed=0)
        finally:
            await engine.close()


async def test_a_vl_rollouts_images_are_saved_once_and_shown_at_their_turns_in_viewer_and_dashboard(vl_tok, tmp_path):
    traj = await _play(vl_tok, tmp_path, build_scripted_qwen3_vl, horizon=3)
    assert traj.finish_reason == "max_turns" and [im.turn for im in traj.images] == [0, 1], traj.error
    digest = hashlib.sha256(DIGITS).hexdigest()
    assert {im.sha256 for im in traj.images} == {digest}

    run = tmp_path / "run"
    save_transcripts(run / "transcripts" / "step_000001.jsonl", [traj])
    line = (run / "transcripts" / "step_000001.jsonl").read_text()
    assert line.count(traj.images[0].data_b64) == 1  # the repeat keeps its record, not the bytes again
    (saved,) = load_transcripts(run / "transcripts")
    assert [(im.omitted, im.start, im.tokens) for im in saved.images] == [
        (None, traj.images[0].start, traj.images[0].tokens), (REPEAT, traj.images[1].start, traj.images[1].tokens)]
    assert saved.images[1].data_b64 == "" and traj.images[1].data_b64  # the trajectory itself is left whole

    page = render_html([saved])
    shown = _images(page)
    assert [turn.split()[1] for turn, _ in shown] == ["tool", "tool"]  # in the two tool turns, none elsewhere
    for _, img in shown:
        assert _bytes_of(img["src"]) == DIGITS and img["data-sha256"] == digest
    assert "81×33 image/png" in page and "render_digits" in page and "2 images" in page

    dash = Dashboard([run], tokenizers=False)  # the dashboard's transcript view: the viewer's own fragment
    fragment = dash.api("transcript", {"run": "0", "id": traj.id})["html"]
    assert [_bytes_of(img["src"]) for _, img in _images(fragment)] == [DIGITS, DIGITS]
    assert fragment == trajectory_html(saved)
    assert dash.api("transcripts", {"run": "0"})[0]["images"] == 2  # the list's column

    # A real browser decodes them, in the viewer (one offline file: nothing is fetched) and in the live dashboard.
    path = tmp_path / "viewer.html"
    path.write_text(page, encoding="utf-8")
    decoded = "(function(){ var im = Array.from(document.querySelectorAll('%s img'));" \
              " return im.length && im.every(function(i){ return i.complete; }) &&" \
              " im.map(function(i){ return [i.naturalWidth, i.naturalHeight]; }); })()"
    server = make_server([run], port=0, tokenizers=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser = Browser(tmp_path / "chrome")
    try:
        browser.goto(path.as_uri())
        in_viewer = browser.wait_js(decoded % "main", what="the viewer's images")
        browser.record_script_errors()
        browser.goto(f"http://127.0.0.1:{server.server_address[1]}/?poll=300")
        browser.wait_js("document.querySelectorAll('#tlist tr').length === 1", 120, "the transcript list")
        browser.js("document.querySelector('#tlist tr').click()")
        in_dashboard = browser.wait_js(decoded % "#viewer", what="the dashboard's images")
        assert not browser.script_errors()
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
    assert in_viewer == in_dashboard == [[81, 33], [81, 33]]


async def test_a_text_only_policy_shows_the_note_it_read_and_the_image_when_the_run_keeps_it(qwen_tokenizer, tmp_path):
    note = "[image 81x33 image/png not shown: this model cannot see images]"
    traj = await _play(qwen_tokenizer, tmp_path, build_scripted_qwen3, horizon=2)
    page = render_html([traj])
    assert _images(page) == [] and traj.images == [] and traj.unseen_images == []
    assert note in page

    kept = await _play(qwen_tokenizer, tmp_path, build_scripted_qwen3, horizon=2, keep_unseen_images=True)
    assert kept.images == [] and kept.tool_calls[0].result == note  # the policy read the same note
    assert [(im.turn, im.tool, base64.b64decode(im.data_b64)) for im in kept.unseen_images] == [
        (0, "render_digits", DIGITS)]
    page = render_html(load_transcripts_of(tmp_path, kept))
    assert [(turn.split()[1], _bytes_of(img["src"])) for turn, img in _images(page)] == [("tool", DIGITS)]
    assert note in page and "not shown to the policy (it read a note)" in page


def load_transcripts_of(tmp_path: Path, t: Trajectory) -> list[Trajectory]:
    save_transcripts(tmp_path / "saved" / "step_000001.jsonl", [t])
    return load_transcripts(tmp_path / "saved")


def _record(png: bytes, turn: int | None, tool: str | None = "render_digits") -> TrajectoryImage:
    with Image.open(io.BytesIO(png)) as im:
        width, height = im.size
    return TrajectoryImage(mime_type="image/png", data_b64=base64.b64encode(png).decode(), width=width, height=height,
                           sha256=hashlib.sha256(png).hexdigest(), start=0, tokens=4, turn=turn, tool=tool)


def _traj(images: list[TrajectoryImage], tool_text: str = "ok") -> Trajectory:
    return Trajectory(id="t", prompt_ids=[1], response_ids=[2, 3, 4], loss_mask=[1, 0, 1], logprobs=[0.0] * 3,
                      turns=[TurnSpan(role="assistant", start=0, end=1, text="call"),
                             TurnSpan(role="tool", start=1, end=2, text=tool_text),
                             TurnSpan(role="assistant", start=2, end=3, text="done")],
                      images=images)


def test_past_the_byte_cap_an_image_keeps_its_record_and_the_viewer_says_why():
    a, b = render_png("12"), render_png("345")
    t = _traj([_record(a, None, None), _record(b, 0), _record(a, 0)])
    saved = bounded(t, max_bytes=len(a))
    assert [im.data_b64 != "" for im in saved.images] == [True, False, False]
    assert [im.omitted for im in saved.images][2] == REPEAT
    assert f"over trainer.log.transcript_image_bytes ({len(a)})" in saved.images[1].omitted
    assert bounded(saved, max_bytes=len(a)) == saved  # bounding again under the same cap changes nothing
    page = render_html([saved])
    shown = _images(page)
    assert [(turn.split()[0], _bytes_of(img["src"])) for turn, img in shown] == [("prompt", a), ("turn", a)]
    assert "not saved: the trajectory&#x27;s images would take" in page
    assert all(im.data_b64 == "" for im in bounded(t, max_bytes=0).images)


def test_a_hand_edited_record_cannot_inject_markup_through_an_image():
    png = render_png("7")
    bad = [_record(png, 0).model_copy(update={"mime_type": 'image/png" onerror="alert(1)'}),
           _record(png, 0).model_copy(update={"data_b64": 'AAAA" onerror="alert(1)', "tool": "<b>x</b>"})]
    page = render_html([_traj(bad)])
    assert _images(page) == [] and "onerror=\"alert" not in page and "<b>x</b>" not in page
    assert page.count("not shown: the saved record is not a") == 2


def test_a_long_tool_turn_shows_its_start_and_folds_the_rest():
    tree = "\n".join(f"[{i}] link 'Item {i}'" for i in range(500))
    page = render_html([_traj([], tool_text=tree)])
    head, rest = page.split('<details class="rest">', 1)
    assert f"[{FOLD_LINES - 1}] link" in head and f"[{FOLD_LINES}] link" not in head
    assert f"[{FOLD_LINES}] link" in rest and "[499] link" in rest and f"{500 - FOLD_LINES} more lines" in rest
    assert "[3] link" in render_html([_traj([], tool_text="[3] link 'x'")])  # a short one as it is
    assert '<details class="rest">' not in render_html([_traj([], tool_text="[3] link 'x'")])
