"""The web environment with the official Playwright MCP server as its browser (mcp_configs/web_playwright_env.json):
our server opens the task's site state and scores it (`--browser none`), `@playwright/mcp` browses behind our
server's origin proxy; one episode played through rlfactory's ToolManager over both (navigate, type and click by the
snapshot's refs, evaluate) scores 1, the final URL read by our gate from the browser's own requests, and another
episode's pages are refused.

Never downloads: `@playwright/mcp` is found where `make install` puts it (`<venv>/playwright-mcp`, or
RLFACTORY_PLAYWRIGHT_MCP_DIR) and run with npm offline; the test skips, saying why, without it or Node.js 20+.
"""
from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

from playwright_mcp import NEEDED, offline, ref_of

from rlfactory.tools.manager import ToolManager
from rlfactory.tools.mcp_configs import load_mcp_config
from rlfactory.tools.types import ToolCall

REPO = Path(__file__).resolve().parents[2]
pytestmark = NEEDED


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _configs(port: int, out: Path) -> dict:
    cfgs = load_mcp_config(REPO / "mcp_configs" / "web_playwright_env.json")
    web, pw = cfgs["web"], cfgs["playwright"]
    assert "--browser" in web.args and "--proxy-server" in pw.args
    swap = {"8489": str(port), "http://127.0.0.1:8489": f"http://127.0.0.1:{port}"}
    web = dataclasses.replace(web, args=tuple(swap.get(a, a) for a in web.args))
    pw = offline(dataclasses.replace(pw, args=tuple(swap.get(a, a) for a in pw.args)), "--output-dir", str(out))
    return {"web": web, "playwright": pw}


async def test_an_episode_through_playwright_mcp_scores_one(tmp_path):
    from rlfactory.envs.web.env import split_tasks
    from rlfactory.envs.web.tasks.build import plan_steps

    config = split_tasks(0)["train"][0]  # what reset(0) opens
    steps = list(plan_steps(config))
    assert [s["action"] for s in steps] == ["type", "click", "stop"], steps  # a search, a product page, its price
    async with ToolManager(_configs(_free_port(), tmp_path)) as tm:
        opened = await tm.call(ToolCall(name="web.reset", arguments={"task_id": 0, "episode_id": "e1"}))
        assert not opened.is_error, opened.text
        observation = opened.structured["observation"]
        assert observation.startswith(f"Task: {config['intent']}")
        start = re.search(r"^Start URL: (\S+)$", observation, re.MULTILINE).group(1)
        r = await tm.call(ToolCall(name="browser_navigate", arguments={"url": start}))
        assert not r.is_error, r.text
        snap = (await tm.call(ToolCall(name="browser_snapshot", arguments={}))).text
        r = await tm.call(ToolCall(name="browser_type", arguments={
            "element": "Search box", "target": ref_of(snap, steps[0]["role"], steps[0]["name"]),
            "text": steps[0]["text"], "submit": True}))
        assert not r.is_error, r.text
        snap = (await tm.call(ToolCall(name="browser_snapshot", arguments={}))).text
        r = await tm.call(ToolCall(name="browser_click", arguments={
            "element": "the product", "target": ref_of(snap, steps[1]["role"], steps[1]["name"])}))
        assert not r.is_error, r.text
        snap = (await tm.call(ToolCall(name="browser_snapshot", arguments={}))).text
        final_url = re.search(r"Page URL: (\S+)", snap).group(1)
        assert final_url.startswith(start.rsplit("/shop", 1)[0])
        # Another episode's pages are not this episode's: the gate refuses them.
        other = start.replace(re.search(r"/e/([^/]+)/", start).group(1), "someone-else")
        r = await tm.call(ToolCall(name="browser_navigate", arguments={"url": other}))
        assert "403" in r.text, r.text
        scored = await tm.call(ToolCall(name="web.evaluate", arguments={
            "answer": steps[2]["answer"], "episode_id": "e1"}))
        assert not scored.is_error, scored.text
        assert scored.structured["done"] and scored.structured["score"] == 1.0
        # No final_url given: the last page the gate saw the browser load (the refused one is no page of it).
        assert f"(final URL {final_url})" in scored.text
        wrong = await tm.call(ToolCall(name="web.reset", arguments={"task_id": 0, "episode_id": "e1"}))
        scored = await tm.call(ToolCall(name="web.evaluate", arguments={"answer": "no idea", "final_url": final_url,
                                                                        "episode_id": "e1"}))
        assert not wrong.is_error and scored.structured["score"] == 0.0
        await tm.call(ToolCall(name="web.close", arguments={"episode_id": "e1"}))
