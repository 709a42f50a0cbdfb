"""The web browser (rlfactory/envs/web/browser/): WebArena's actions parsed, its observation rendered, and real headless
Chromium against the real probe site — browsing, containment (each way out tried), feedback for the model's
mistakes, forks, and crashes counted as infrastructure."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket

import psutil
import pytest

from rlfactory.envs.types import EnvError
from rlfactory.envs.web.browser.actions import ActionParseError, parse_action
from rlfactory.envs.web.browser.adapter import BrowserLost
from rlfactory.envs.web.browser.observation import IdTable, parse_snapshot, render
from rlfactory.envs.web.browser.policy import OriginPolicy

needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None and not os.path.exists("/usr/bin/chromium"),
                                    reason="Debian's chromium is not installed (apt-get install chromium)")


def test_actions_parse_as_webarena_writes_them():
    assert parse_action("click [12]").element == "12"
    a = parse_action("Let me search. In summary, the next action I will perform is ```type [3] [red shirt] [0]```")
    assert (a.name, a.element, a.text, a.press_enter) == ("type", "3", "red shirt", False)
    assert parse_action("type [3] [click here]").text == "click here"  # an action word inside the text
    assert parse_action("stop [$10 [about]]").text == "$10 [about]"
    assert parse_action("stop").text == ""
    assert parse_action("scroll down").text == "down" and parse_action("tab_focus [1]").tab == 1
    assert parse_action("goto [http://127.0.0.1:8001/a?b=1]").text == "http://127.0.0.1:8001/a?b=1"
    for bad, why in [("hello", "No action found"), ("click [abc]", "is not an element id"),
                     ("type [3]", "needs the text"), ("scroll [left]", "up or down"),
                     ("type [3] [x] [2]", "press_enter must be 0 or 1"), ("tab_focus [x]", "not a tab index")]:
        with pytest.raises(ActionParseError, match=re.escape(why)) as e:
            parse_action(bad)
        assert "click [id], type [id] [text] [press_enter]" in str(e.value)  # the language is shown


def test_origin_policy():
    p = OriginPolicy.of(["http://127.0.0.1:8001/shop", "http://localhost:8002"])
    assert p.allows("http://127.0.0.1:8001/anything?x=1") and p.allows("about:blank")
    assert p.allows("HTTP://LOCALHOST:8002/")
    for url in ("http://127.0.0.1:8003/", "https://127.0.0.1:8001/", "file:///etc/passwd", "data:text/html,x",
                "chrome://crash", "javascript:alert(1)", "http://127.0.0.1:99999/"):
        assert not p.allows(url), url
    assert p.refusal("/relative", base="http://127.0.0.1:8001/a") is None
    assert "outside this episode's sites" in p.refusal("http://example.com/")
    with pytest.raises(ValueError, match="not an http"):
        OriginPolicy.of(["file:///tmp"])


def test_observation_renders_ids_and_says_what_was_cut():
    snap = "\n".join([
        '- generic [active] [ref=e1]:',
        '  - heading "Shop" [level=1] [ref=e2]',
        '  - link "Buy \\"red\\" shirt" [ref=e4] [cursor=pointer]:',
        '    - /url: /p/1',
        '  - text: "yes: 10"',
        '  - button "Nope" [disabled] [ref=e10]',
        '  - paragraph [ref=e12]: Some text',
        *[f'  - listitem [ref=e{100 + i}]: item {i}' for i in range(50)]])
    ids = IdTable()
    tree = parse_snapshot(snap, ids=ids, tab=1)
    assert tree.lines[:5] == ["[1] heading 'Shop' level: 1", "[2] link 'Buy \"red\" shirt'", "StaticText 'yes: 10'",
                              "[3] button 'Nope' disabled: True", "[4] paragraph 'Some text'"]
    assert tree.elements["2"].ref == "e4" and tree.elements["2"].url == "/p/1"
    assert parse_snapshot(snap, ids=ids, tab=1).elements["2"].ref == "e4"  # same ref, same id
    assert parse_snapshot(snap, ids=ids, tab=2).elements.get("2") is None  # another tab's refs get new ids
    text = render(tree=tree, url="http://x/", tabs=["Shop", ""], active_tab=0, notes=["a dialog"], max_chars=400)
    assert text.startswith("Note: a dialog\nTab 0 (current): Shop | Tab 1: (untitled)\nURL: http://x/\n[1] heading")
    assert len(text) <= 400 and re.search(r"\[… \d+ more lines \(\d+ characters\) of this page are not shown", text)


def test_a_long_page_loses_what_is_above_the_view_first():
    snap = "\n".join(['- main [ref=e1] [box=0,-900,1280,2000]:',
                      *[f'  - link "Item {i}" [ref=e{10 + i}] [box=8,{-900 + 40 * i},60,20]' for i in range(60)]])
    tree = parse_snapshot(snap)
    assert tree.bottoms[0] == 1100 and tree.bottoms[1] == -880
    text = render(tree=tree, url="http://x/", tabs=["Shop"], active_tab=0, notes=[], max_chars=600)
    lines = text.splitlines()
    # Items 0-21 end above the view (y + 20 < 0): left out first, said so; then the end is cut.
    assert lines[2] == "[… 22 lines above the visible part of the page are not shown: scroll up for them]"
    assert lines[3] == "[1] main" and lines[4] == "\t[24] link 'Item 22'" and "Item 21'" not in text
    assert "scroll down for them]" in lines[-1] and len(text) <= 600
    assert render(tree=tree, url="u", tabs=["t"], active_tab=0, notes=[], max_chars=5000).count("link") == 60


# ---- real Chromium against the probe site -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def sites():
    from rlfactory.envs.web.browser.probe_site import ProbeSites

    with ProbeSites() as s:
        yield s


@pytest.fixture(scope="module")
def host():
    from rlfactory.envs.web.browser.host import BrowserHost

    h = BrowserHost()
    yield h
    h.close()


@pytest.fixture
def env(host, sites):
    from rlfactory.envs.web.browser.host import BrowserEnv

    e = BrowserEnv(host)
    yield e
    e.close()


def eid(observation: str, name: str) -> str:
    """The id of the element named `name` in an observation."""
    m = re.search(r"\[(\d+)\] \w+ '" + re.escape(name) + "'", observation)
    assert m, f"no element {name!r} in:\n{observation}"
    return m.group(1)


@needs_chromium
def test_browse_search_sign_in_and_tabs(env, sites):
    obs = env.open(sites.url + "/").observation
    assert "Tab 0 (current): Probe home" in obs and f"URL: {sites.url}/" in obs
    assert "[1] heading 'Probe shop'" in obs and "'Secret'" not in obs  # a hidden element gets no id
    assert "'Account from the menu'" not in obs
    obs = env.step(f"hover [{eid(obs, 'Menu')}]").observation  # the menu opens under the mouse
    assert "'Account from the menu'" in obs
    obs = env.step(f"type [{eid(obs, 'Sort')}] [Name] [0]").observation
    obs = env.step(f"type [{eid(obs, 'Search')}] [shirt]").observation  # Enter submits the form
    assert f"URL: {sites.url}/search?q=shirt&sort=Name" in obs and "'Results for shirt by Name'" in obs
    obs = env.step("go_back").observation
    obs = env.step(f"type [{eid(obs, 'Search')}] [hat] [0]").observation
    assert f"URL: {sites.url}/\n" in obs  # typed, not sent
    obs = env.step("press [enter]").observation
    assert "'Results for hat by Name'" in obs or "'Results for hat by Price'" in obs
    obs = env.step("go_back").observation
    assert f"URL: {sites.url}/" in obs
    obs = env.step(f"click [{eid(obs, 'Products')}]").observation
    obs = env.step(f"click [{eid(obs, 'Green hat')}]").observation
    assert "'Price: $12.00'" in obs
    obs = env.step("new_tab").observation
    assert "Tab 0: Green hat | Tab 1 (current): (untitled)" in obs and "URL: about:blank" in obs
    obs = env.step(f"goto [{sites.url}/account]").observation
    assert "'Nobody'" in obs
    obs = env.step("tab_focus [0]").observation
    assert "Tab 0 (current): Green hat" in obs
    obs = env.step("tab_focus [1]").observation
    obs = env.step("close_tab").observation
    assert "Tab 0 (current): Green hat" in obs and "Tab 1" not in obs
    obs = env.step("scroll [down]").observation  # moves the page, not the tree
    assert "'Green hat'" in obs
    result = env.step("stop [the green hat costs $12]")
    assert result.done and "the green hat costs $12" in result.observation
    assert env.step("click [1]").done  # an ended episode stays ended


@needs_chromium
def test_containment_every_way_out_is_refused(env, sites, tmp_path):
    obs = env.open(sites.url + "/", [sites.url]).observation
    home = obs
    tries = {
        "goto another host": "goto [" + sites.outside_url + "/]",
        "goto file": "goto [file:///etc/passwd]",
        "goto data": "goto [data:text/html,<h1>x</h1>]",
        "goto chrome": "goto [chrome://version]",
        "link to another host": f"click [{eid(home, 'Outside site')}]",
        "link to file": f"click [{eid(home, 'Local file')}]",
        "link to data": f"click [{eid(home, 'Data page')}]",
    }
    for what, action in tries.items():
        obs = env.step(action).observation
        assert "failed:" in obs and "outside this episode's sites" in obs, (what, obs)
        assert f"URL: {sites.url}/\n" in obs, what
    # A redirect out of the sites, at the first hop or a later one, is refused by the context's proxy.
    for link in ("Redirect away", "Redirect twice"):
        obs = env.step(f"click [{eid(home, link)}]").observation
        assert "Note: a request was refused: " + sites.outside_url + "/from-redirect is outside" in obs, obs
        obs = env.step(f"goto [{sites.url}/]").observation
        home = obs
    obs = env.step(f"click [{eid(obs, 'Download report')}]").observation
    assert "Note: a download of 'report.bin' was refused" in obs and f"URL: {sites.url}/\n" in obs
    obs = env.step(f"click [{eid(obs, 'Open pop-up')}]").observation
    assert f"Note: a pop-up window ({sites.url}/products) was refused" in obs and "Tab 1" not in obs
    obs = env.step(f"click [{eid(obs, 'Products in a new window')}]").observation
    assert f"Note: a pop-up window ({sites.url}/products) was refused" in obs and "Tab 1" not in obs
    obs = env.step(f"click [{eid(obs, 'Say hello')}]").observation
    assert "Note: a JavaScript alert dialog said 'Hello from the probe' and was accepted" in obs
    obs = env.step(f"click [{eid(obs, 'Ask')}]").observation
    assert "confirm dialog said 'Sure?' and was accepted" in obs and "'confirmed'" in obs
    assert sites.outside_hits == []  # the other site never saw a request


@needs_chromium
def test_model_mistakes_are_feedback(env, sites):
    obs = env.open(sites.url + "/").observation
    for action, says in [("clik [3]", "Invalid action: No action found"), ("click [9999]", "no element [9999]"),
                         (f"click [{eid(obs, 'Unavailable')}]", "that element is disabled"),
                         ("tab_focus [5]", "there is no tab 5"), ("close_tab", "this is the only tab"),
                         ("go_forward", "no later page"), ("press [NoSuchKey]", "press [NoSuchKey] failed")]:
        result = env.step(action)
        assert not result.done and says in result.observation, (action, result.observation)
        assert f"URL: {sites.url}/\n" in result.observation
    target = eid(obs, "Target")
    # The element goes hidden behind the model's back (the page is the adapter's playwright page).
    env.host.run(env.episode.context.tab.page.evaluate("document.getElementById('target').style.display='none'"))
    assert "that element is hidden" in env.step(f"click [{target}]").observation
    with pytest.raises(EnvError, match="outside this episode's sites") as e:
        env.open(sites.outside_url + "/", [sites.url])
    assert not e.value.infra  # a wrong start URL is the caller's mistake
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    with pytest.raises(BrowserLost, match="answered HTTP 502; is the site up") as e:
        env.open(down + "/")
    assert e.value.infra  # a site that is down is the infrastructure's


@needs_chromium
def test_scroll_brings_a_long_pages_end_into_a_short_observation(host, sites):
    from rlfactory.envs.web.browser.host import BrowserEnv

    env = BrowserEnv(host, max_chars=600)
    try:
        obs = env.open(sites.url + "/").observation
        assert "'Probe shop'" in obs and "'Footer text'" not in obs and "scroll down for them]" in obs
        for _ in range(6):  # the tall section is 3000 px
            obs = env.step("scroll [down]").observation
            if "'Footer text'" in obs:
                break
        assert "'Footer text'" in obs and "'Probe shop'" not in obs
        assert "lines above the visible part of the page are not shown: scroll up for them" in obs
    finally:
        env.close()


@needs_chromium
def test_fork_copies_cookies_and_pages_not_the_future(env, sites):
    obs = env.open(sites.url + "/").observation
    obs = env.step(f"type [{eid(obs, 'Name')}] [ada]").observation
    assert f"URL: {sites.url}/account" in obs and "'Signed in as ada'" in obs
    twin = env.fork()
    try:
        t_obs = twin.observe()
        assert f"URL: {sites.url}/account" in t_obs and "'Signed in as ada'" in t_obs
        twin.step("goto [/products]")
        assert f"URL: {sites.url}/account" in env.observe()  # the original did not move
    finally:
        twin.close()
    assert "'Signed in as ada'" in env.step("goto [/]").observation


@needs_chromium
def test_closed_episodes_leave_no_context_open(host, sites):
    from rlfactory.envs.web.browser.host import BrowserEnv

    before = host.chromium.open_contexts
    envs = [BrowserEnv(host) for _ in range(3)]
    for e in envs:
        e.open(sites.url + "/")
    twin = envs[0].fork()
    proxies = [e.episode.context.proxy for e in (*envs, twin)]
    assert host.chromium.open_contexts == before + 4
    for e in (*envs, twin):
        e.close()
    assert host.chromium.open_contexts == before and all(p._server is None for p in proxies)


@needs_chromium
def test_crashes_are_infrastructure_and_the_browser_comes_back(sites):
    from rlfactory.envs.web.browser.host import BrowserEnv, BrowserHost

    host = BrowserHost()
    try:
        env = BrowserEnv(host)
        env.open(sites.url + "/")
        # A page crash (its renderer dies): the episode is lost, as infrastructure.
        host.run(_crash(env.episode.context.tab.page))
        with pytest.raises(BrowserLost, match="crashed") as e:
            env.step("scroll [down]")
        assert e.value.infra
        with pytest.raises(BrowserLost):
            env.observe()  # and stays lost
        obs = env.open(sites.url + "/products").observation  # a new context on the same browser
        assert "'Products'" in obs and host.chromium.launches == 1
        # The whole browser dies: every episode on it is lost; the next one gets a new browser.
        other = BrowserEnv(host)
        other.open(sites.url + "/")
        browser = host.chromium.process()
        browser.kill()
        psutil.wait_procs([browser], timeout=10)
        for victim in (env, other):
            with pytest.raises(BrowserLost) as e:
                for _ in range(50):  # until the driver has noticed the process is gone
                    victim.step("scroll [down]")
            assert e.value.infra
        fresh = BrowserEnv(host)
        assert "'Probe shop'" in fresh.open(sites.url + "/").observation
        assert host.chromium.launches == 2
        fresh.close()
    finally:
        host.close()


async def _crash(page) -> None:
    # The navigation fails because the page crashed: that is the point.
    with contextlib.suppress(Exception):
        await page.goto("chrome://crash", timeout=10_000)


async def test_the_origin_proxy_forwards_only_the_sites(sites):
    """The context's proxy on its own, as the browser speaks to it: absolute-form GETs and CONNECT tunnels."""
    import asyncio

    from rlfactory.envs.web.browser.proxy import OriginProxy

    notes: list[str] = []
    proxy = await OriginProxy(OriginPolicy.of([sites.url]), notes.append).start()
    port = int(proxy.url.rsplit(":", 1)[1])

    async def ask(head: str) -> bytes:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(head.encode())
        await w.drain()
        reply = await r.read()
        w.close()
        return reply

    try:
        ok = await ask(f"GET {sites.url}/products HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and b"Green hat" in ok
        download = await ask(f"GET {sites.url}/download HTTP/1.1\r\nHost: x\r\n\r\n")
        assert download.startswith(b"HTTP/1.1 204") and b"secret report" not in download
        assert notes.pop() == "a download of 'report.bin' was refused"
        out = await ask(f"GET {sites.outside_url}/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 403") and b"outside this episode's sites" in out
        host_port = sites.outside_url.split("//")[1]
        tunnel = await ask(f"CONNECT {host_port} HTTP/1.1\r\nHost: {host_port}\r\n\r\n")
        assert tunnel.startswith(b"HTTP/1.1 403")
        assert (await ask("CONNECT safebrowsing.googleapis.com:443 HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 403")
        # A tunnel to the site's own host and port is opened (the way https and wss go).
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(f"CONNECT {sites.url.split('//')[1]} HTTP/1.1\r\n\r\n".encode())
        assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        w.write(b"GET /products HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b"Green hat" in await r.read()
        w.close()
        assert len(notes) == 2 and proxy.refused == 3  # Chromium's own services are refused without a note
        # An allowed site that is down is a 502 that says so.
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{closed.getsockname()[1]}"
        closed.close()
        proxy.policy = OriginPolicy.of([sites.url, f"http://{down}"])
        gone = await ask(f"GET http://{down}/ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert gone.startswith(b"HTTP/1.1 502") and f"The site at {down} did not answer".encode() in gone
        assert sites.outside_hits == []
    finally:
        await proxy.close()
