"""The browser MCP server (envs/tools/browser.py) over real MCP stdio, real Chromium and the real probe site: its tools,
episodes kept apart, a PNG screenshot, a fork, errors for the model vs. infrastructure failures, and cleanup."""
from __future__ import annotations

import base64
import json
import os
import struct
import sys

import psutil
import pytest
import pytest_asyncio

from rlfactory.tools.types import INFRA_KEY, LOOP_ONLY_META

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                 reason="Debian's chromium is not installed (apt-get install chromium)")]


@pytest.fixture(scope="module")
def sites():
    from rlfactory.envs.web.browser.probe_site import ProbeSites

    with ProbeSites() as s:
        yield s


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server():
    """One server for the module, through rlfactory's MCP adapter (its owner task keeps the SDK's cancel scopes in
    one task); the raw SDK session, so that image content arrives as it was sent."""
    from rlfactory.tools.mcp_client import MCPConnection
    from rlfactory.tools.mcp_configs import ServerConfig

    conn = MCPConnection(ServerConfig("browser", "test", "stdio", command=sys.executable,
                                      args=("-m", "rlfactory.envs.tools.browser")))
    await conn.open(timeout_s=60)
    try:
        yield conn.session
    finally:
        await conn.close()


async def call(server, tool: str, **arguments):
    result = await server.call_tool(tool, arguments)
    text = result.content[0].text if result.content and result.content[0].type == "text" else ""
    return result, text, dict(result.structured_content or {})


async def stats(server) -> dict:
    res = await server.read_resource("rlfactory://episodes")
    return json.loads(res.contents[0].text)


async def test_tools_and_an_episode_apart_from_another(server, sites):
    tools = {t.name: t for t in (await server.list_tools()).tools}
    assert set(tools) == {"open", "act", "observe", "screenshot", "close", "fork"}
    assert (tools["fork"].meta or {}).get(LOOP_ONLY_META) is True and not (tools["act"].meta or {}).get(LOOP_ONLY_META)
    assert "click [id]" in tools["act"].description
    _, text, s = await call(server, "open", start_url=sites.url + "/", allowed_origins=[sites.url], episode_id="a")
    assert s["done"] is False and s["episode_id"] == "a" and "Tab 0 (current): Probe home" in text
    name_id = next(line.split("]")[0][1:] for line in s["observation"].splitlines() if "textbox 'Name'" in line)
    _, text, s = await call(server, "act", action=f"type [{name_id}] [ada]", episode_id="a")
    assert "'Signed in as ada'" in s["observation"] and s["steps"] == 1
    _, _, b = await call(server, "open", start_url=sites.url + "/account", episode_id="b")
    assert "'Nobody'" in b["observation"]  # b has a context, and cookies, of its own
    _, text, _ = await call(server, "observe", episode_id="a")
    assert "'Signed in as ada'" in text
    _, _, s = await call(server, "act", action="stop [done]", episode_id="a")
    assert s["done"] is True and "done" in s["observation"]
    for ep in ("a", "b"):
        _, _, closed = await call(server, "close", episode_id=ep)
        assert closed["closed"] is True
    assert (await stats(server))["open"] == 0


async def test_screenshot_is_a_png_image(server, sites):
    await call(server, "open", start_url=sites.url + "/", episode_id="shot")
    result, _, _ = await call(server, "screenshot", episode_id="shot")
    assert not result.is_error and result.content[0].type == "image" and result.content[0].mime_type == "image/png"
    png = base64.b64decode(result.content[0].data)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1280, 720)
    await call(server, "close", episode_id="shot")


async def test_fork_goes_on_apart(server, sites):
    await call(server, "open", start_url=sites.url + "/products", episode_id="root")
    _, _, f = await call(server, "fork", into="root/1", episode_id="root")
    assert f["episode_id"] == "root/1" and f"URL: {sites.url}/products" in f["observation"]
    await call(server, "act", action=f"goto [{sites.url}/account]", episode_id="root/1")
    _, text, _ = await call(server, "observe", episode_id="root")
    assert f"URL: {sites.url}/products" in text
    for ep in ("root", "root/1"):
        await call(server, "close", episode_id=ep)
    assert (await stats(server))["open"] == 0


async def test_errors_for_the_model_and_for_the_infrastructure(server, sites):
    result, text, _ = await call(server, "act", action="click [1]", episode_id="nobody")
    assert "No episode is open: call open(start_url, allowed_origins) first." in text
    result, text, s = await call(server, "open", start_url=sites.outside_url + "/", allowed_origins=[sites.url],
                                 episode_id="out")
    assert result.is_error and "outside this episode's sites" in text and not s.get(INFRA_KEY)
    _, _, s = await call(server, "open", start_url=sites.url + "/", episode_id="doomed")
    # Chromium dies under the episode: its next step is an infrastructure failure, and the next episode gets a new
    # browser.
    browsers = [p for p in psutil.process_iter(["cmdline"])
                if "--rlfactory-browser-tag" in " ".join(p.info["cmdline"] or []) and
                "--type" not in " ".join(p.info["cmdline"] or []) and _descends_from_us(p)]
    assert len(browsers) == 1
    browsers[0].kill()
    psutil.wait_procs(browsers, timeout=10)
    result, text, s = await call(server, "act", action="scroll [down]", episode_id="doomed")
    assert result.is_error and s == {INFRA_KEY: True} and "the browser process died" in text, text
    _, _, s = await call(server, "open", start_url=sites.url + "/", episode_id="next")
    assert "'Probe shop'" in s["observation"]
    for ep in ("out", "doomed", "next"):
        await call(server, "close", episode_id=ep)


def _descends_from_us(proc: psutil.Process) -> bool:
    """A browser of the module's server (a child of this process): not another test's, nor another worker's."""
    me = os.getpid()
    try:
        chain = proc.parents()
        return any(p.pid == me for p in chain) and any(
            "rlfactory.envs.tools.browser" in " ".join(p.cmdline()) and p.ppid() == me for p in chain)
    except psutil.NoSuchProcess:
        return False


async def test_episodes_open_by_task_id_with_start_urls(sites):
    """`--start-url ... --allow ...`: `reset(task_id)` opens the task's start page (what a task row's `env` asks of
    the loop before the first turn), and the policy is offered no `open` to pick its own sites."""
    from rlfactory.tools.mcp_client import MCPConnection
    from rlfactory.tools.mcp_configs import ServerConfig

    conn = MCPConnection(ServerConfig("browser", "test", "stdio", command=sys.executable, args=(
        "-m", "rlfactory.envs.tools.browser", "--start-url", sites.url + "/", "--start-url", sites.url + "/products",
        "--allow", sites.url)))
    await conn.open(timeout_s=60)
    try:
        tools = {t.name for t in (await conn.session.list_tools()).tools}
        assert "reset" in tools and "open" not in tools
        _, _, s = await call(conn.session, "reset", task_id=3, episode_id="t3")  # 3 % 2: the second start URL
        assert f"URL: {sites.url}/products" in s["observation"]
        _, _, s = await call(conn.session, "act", action=f"goto [{sites.outside_url}/]", episode_id="t3")
        assert "outside this episode's sites" in s["observation"]
        await call(conn.session, "close", episode_id="t3")
    finally:
        await conn.close()
