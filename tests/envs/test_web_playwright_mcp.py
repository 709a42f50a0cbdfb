"""The official Playwright MCP server (`npx @playwright/mcp@0.0.86`), unchanged, as listed in
mcp_configs/playwright.json, driven through rlfactory's tool layer (ToolManager over the MCP client adapter) against
the real probe site: its tools listed, navigate, snapshot, click, and another origin refused with --allowed-origins;
and the same server contained for real by our origin proxy (`--proxy-server`), which also stops a redirect out.

Never downloads: the package is installed by `make install` / .ci/run into `<venv>/playwright-mcp` (or the folder
RLFACTORY_PLAYWRIGHT_MCP_DIR names); npx runs there with npm offline, so it uses that copy or fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from playwright_mcp import NEEDED, VERSION, offline, ref_of

from rlfactory.tools.manager import ToolManager
from rlfactory.tools.mcp_configs import load_mcp_config
from rlfactory.tools.types import ToolCall

REPO = Path(__file__).resolve().parents[2]
pytestmark = NEEDED


@pytest.fixture(scope="module")
def sites():
    from rlfactory.envs.web.browser.probe_site import ProbeSites

    with ProbeSites() as s:
        yield s


async def test_official_playwright_mcp_through_our_tool_layer(sites, tmp_path):
    cfg = load_mcp_config(REPO / "mcp_configs" / "playwright.json")["playwright"]
    assert cfg.args[:2] == ("--yes", f"@playwright/mcp@{VERSION}")  # --yes: npx installs it without asking
    assert "--isolated" in cfg.args and "--headless" in cfg.args
    # The shipped entry, run where the package is installed and offline; its origin rule and output folder added.
    cfg = offline(cfg, "--allowed-origins", sites.url, "--output-dir", str(tmp_path))
    async with ToolManager({"playwright": cfg}) as tm:
        names = {s.name for s in tm.specs}
        assert {"browser_navigate", "browser_snapshot", "browser_click", "browser_type", "browser_tabs"} <= names
        r = await tm.call(ToolCall(name="browser_navigate", arguments={"url": sites.url + "/"}))
        assert not r.is_error and "Page Title: Probe home" in r.text, r.text
        snap = (await tm.call(ToolCall(name="browser_snapshot", arguments={}))).text
        assert 'heading "Probe shop"' in snap
        ref = ref_of(snap, "link", "Products")
        r = await tm.call(ToolCall(name="browser_click", arguments={"element": "Products link", "target": ref}))
        assert not r.is_error, r.text
        snap = (await tm.call(ToolCall(name="browser_snapshot", arguments={}))).text
        assert f"Page URL: {sites.url}/products" in snap and 'link "Green hat"' in snap
        r = await tm.call(ToolCall(name="browser_navigate", arguments={"url": sites.outside_url + "/"}))
        assert r.is_error and "ERR_BLOCKED_BY_CLIENT" in r.text
    assert sites.outside_hits == []


async def test_official_playwright_mcp_contained_by_our_proxy(sites, tmp_path):
    """--allowed-origins does not see redirects (Playwright says so); a browser behind our origin proxy is refused
    at every hop: the probe site's two-hop redirect out never reaches the outside site."""
    from rlfactory.envs.web.browser.policy import OriginPolicy
    from rlfactory.envs.web.browser.proxy import OriginProxy

    notes: list[str] = []
    proxy = await OriginProxy(OriginPolicy.of([sites.url]), notes.append).start()
    cfg = load_mcp_config(REPO / "mcp_configs" / "playwright.json")["playwright"]
    cfg = offline(cfg, "--proxy-server", proxy.url, "--output-dir", str(tmp_path))
    try:
        async with ToolManager({"playwright": cfg}) as tm:
            r = await tm.call(ToolCall(name="browser_navigate", arguments={"url": sites.url + "/hop"}))
            assert "HTTP status: 403" in r.text, r.text
            r = await tm.call(ToolCall(name="browser_navigate", arguments={"url": sites.url + "/products"}))
            assert not r.is_error and "Page Title: Products" in r.text
    finally:
        await proxy.close()
    assert any(sites.outside_url + "/from-redirect is outside" in n for n in notes), notes
    assert sites.outside_hits == [] and proxy.forwarded >= 3
