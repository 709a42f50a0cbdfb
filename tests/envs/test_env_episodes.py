"""The episode registry: bounds, idle expiry, close, session cleanup, and a leak test over real MCP stdio."""
from __future__ import annotations

import asyncio
import gc
import threading
import tracemalloc

from child_processes import running_children

from rlfactory.envs.episodes import EpisodeRegistry
from rlfactory.envs.mcp_server import EpisodeKeys
from rlfactory.envs.textcraft import TextCraftEnv


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Probe:
    """An environment that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_open_get_close():
    reg = EpisodeRegistry(Probe, max_episodes=4)
    ep = reg.open("a")
    assert reg.open("a") is ep and reg.get("a") is ep and len(reg) == 1
    assert reg.close("a") and ep.env.closed
    assert not reg.close("a") and reg.get("a") is None and len(reg) == 0


def test_bounded_count_evicts_least_recently_used():
    reg = EpisodeRegistry(Probe, max_episodes=3)
    eps = {k: reg.open(k) for k in "abc"}
    reg.get("a")  # a is now the most recently used; b the least
    reg.open("d")
    assert sorted(reg.keys()) == ["a", "c", "d"]
    assert eps["b"].env.closed and not eps["a"].env.closed
    assert reg.stats()["evicted_total"] == 1


def test_the_registry_remembers_what_it_closed_itself_and_forgets_what_was_closed_on_request():
    """A call on an evicted or expired episode is the server's doing (an infrastructure failure for the caller); a
    call on one closed on request, or never opened, is not. Opening the key again clears it; the memory is bounded."""
    clock = Clock()
    reg = EpisodeRegistry(Probe, max_episodes=2, idle_timeout_s=60, clock=clock)
    reg.open("a")
    reg.open("b")
    reg.open("c")  # evicts a
    reg.close("b")
    clock.now = 100
    reg.expire()  # c idle 100 s
    assert (reg.lost("a"), reg.lost("b"), reg.lost("c"), reg.lost("never")) == ("evicted", None, "expired", None)
    reg.open("a")
    assert reg.lost("a") is None
    for i in range(5000):
        reg.open(f"k{i}")
    assert reg.lost("k0") is None and reg.lost("k4997") == "evicted"  # the oldest are forgotten


def test_idle_episodes_expire():
    clock = Clock()
    reg = EpisodeRegistry(Probe, max_episodes=10, idle_timeout_s=60, clock=clock)
    old = reg.open("old")
    clock.now = 50
    fresh = reg.open("fresh")
    clock.now = 70  # old idle 70 s, fresh 20 s
    assert reg.expire() == 1
    assert old.env.closed and not fresh.env.closed and reg.keys() == ["fresh"]


def test_close_prefix_and_close_all():
    reg = EpisodeRegistry(Probe)
    for k in ("session:1", "session:1:x", "session:2", "id:z"):
        reg.open(k)
    assert reg.close_prefix("session:1") == 2
    assert sorted(reg.keys()) == ["id:z", "session:2"]
    assert reg.close_all() == 2 and len(reg) == 0


def test_session_episodes_close_when_the_connection_goes_away():
    reg = EpisodeRegistry(Probe)
    keys = EpisodeKeys(reg)

    class Connection:  # stands for mcp's per-client Connection object
        pass

    conn = Connection()
    key = keys.session_key(conn)
    assert keys.session_key(conn) == key
    ep = reg.open(key)
    del conn
    gc.collect()
    assert ep.env.closed and len(reg) == 0


def test_concurrent_use_from_threads_stays_consistent():
    reg = EpisodeRegistry(TextCraftEnv, max_episodes=16)

    def worker(n: int) -> None:
        for i in range(200):
            key = f"{n}-{i % 20}"
            ep = reg.open(key)
            with ep.lock:
                ep.env.reset(i)
                ep.env.step("inventory")
            if i % 3 == 0:
                reg.close(key)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = reg.stats()
    assert s["open"] <= 16
    assert s["opened_total"] == s["open"] + s["closed_total"]


def test_thousands_of_episodes_in_process_do_not_grow_memory():
    reg = EpisodeRegistry(TextCraftEnv, max_episodes=64)

    def run(n: int, start: int) -> None:
        for i in range(start, start + n):
            ep = reg.open(f"e{i}")
            ep.env.reset(i)
            ep.env.step("get 1 oak log")
            reg.close(f"e{i}")

    run(200, 0)  # warm caches (recipe book, regexes)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(2000, 200)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert len(reg) == 0
    assert grown < 256 * 1024, f"{grown} bytes still allocated after 2000 closed episodes"


def _server_rss(script: str) -> int:
    procs = running_children(script)
    assert len(procs) == 1, procs
    return procs[0].memory_info().rss


async def test_leak_thousands_of_episodes_over_mcp(open_env):
    async with open_env("textcraft.py", "--max-episodes", "64") as env:
        sem = asyncio.Semaphore(32)

        async def episode(i: int, close: bool = True) -> None:
            async with sem:
                await env.call("reset", task_id=i, episode_id=f"ep{i}")
                await env.call("step", action="get 1 oak log", episode_id=f"ep{i}")
                if close:
                    await env.call("close", episode_id=f"ep{i}")

        await asyncio.gather(*(episode(i) for i in range(200)))
        rss_warm = _server_rss("textcraft.py")
        await asyncio.gather(*(episode(i) for i in range(200, 1500)))
        rss_after = _server_rss("textcraft.py")
        stats = await env.stats()
        assert stats["open"] == 0 and stats["opened_total"] == 1500 and stats["closed_total"] == 1500
        assert rss_after - rss_warm < 20 * 2**20, f"server RSS grew {(rss_after - rss_warm) / 2**20:.1f} MiB"

        # Episodes never closed (crashed trajectories) stay bounded by --max-episodes.
        await asyncio.gather(*(episode(i, close=False) for i in range(2000, 2200)))
        stats = await env.stats()
        assert stats["open"] == 64 and stats["evicted_total"] == 200 - 64

        # A call on an episode the server evicted is an infrastructure failure that says why and what to change.
        result = await env.session.call_tool("step", {"action": "get 1 oak log", "episode_id": "ep2000"})
        assert result.is_error and (result.structured_content or {}).get("rlfactory/infra") is True
        assert "hold" in result.content[0].text and "--max-episodes" in result.content[0].text
        tools = (await env.session.list_tools()).tools
        assert {t.name: (t.meta or {}).get("rlfactory/max_episodes") for t in tools}["step"] == 64
