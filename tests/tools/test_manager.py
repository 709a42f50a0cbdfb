"""ToolManager against real MCP server subprocesses (stdio and streamable HTTP) and a real Redis."""
from __future__ import annotations

import pytest
import pytest_asyncio
from mcp_helpers import HttpToolbox, alive, child_pids, leftover_children, toolbox_entry, write_config

from rlfactory.recipe.tools import CacheConfig
from rlfactory.tools.cache.base import CACHE_URL_ENV
from rlfactory.tools.cache.factory import make_cache
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.types import ToolCall

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def tm(tmp_path_factory):
    """Three servers: `tb` and `tb2` share tool names (collisions); `bounded` has max_concurrency 3 and a rate limit."""
    cfg = write_config(tmp_path_factory.mktemp("mgr") / "tools.json", {
        "tb": toolbox_entry(),
        "tb2": toolbox_entry("--name", "tb2", "--extra-tool", "only2"),
        "bounded": toolbox_entry("--name", "bounded", max_concurrency=3, rate_per_s=500),
    })
    async with ToolManager.from_files([cfg]) as manager:
        yield manager


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


async def test_collisions_are_qualified_and_unique_tools_stay_bare(tm):
    names = {s.name for s in tm.specs}
    assert {"tb.add", "tb2.add", "bounded.add", "only2"} <= names
    assert "add" not in names and "tb2.only2" not in names
    add = tm.resolve("tb.add")
    assert add.server == "tb" and add.tool == "add" and add.read_only and add.idempotent
    assert add.input_schema["required"] == ["a", "b"]
    assert not tm.resolve("tb.count").idempotent
    schemas = {s["function"]["name"]: s for s in tm.openai_schemas()}
    assert schemas["only2"]["type"] == "function"
    assert schemas["tb.echo"]["function"]["parameters"]["properties"]["text"]["type"] == "string"


async def test_calls_return_normalised_results(tm):
    r = await tm.call(ToolCall(name="tb.add", arguments={"a": 2, "b": 40}, id="traj-7/0"))
    assert (r.text, r.is_error, r.error_kind, r.server, r.id, r.cached) == ("42", False, None, "tb", "traj-7/0", False)
    assert r.structured == {"result": 42} and r.latency_s > 0
    # a unique tool answers to its bare and to its qualified name
    assert (await tm.call(call("only2"))).text == "tb2:only2"
    assert (await tm.call(call("tb2.only2"))).text == "tb2:only2"


async def test_model_mistakes_are_error_results_not_exceptions(tm):
    unknown = await tm.call(call("ad", a=1, b=2))
    assert unknown.is_error and unknown.error_kind == "unknown_tool"
    assert "unknown tool 'ad'" in unknown.text and ".add'?" in unknown.text and "Did you mean '" in unknown.text
    missing = await tm.call(call("tb.add", a=1))
    assert missing.error_kind == "bad_arguments" and "missing required argument 'b'" in missing.text
    wrong = await tm.call(call("tb.add", a="one", b=2))
    assert wrong.error_kind == "bad_arguments" and "argument 'a' must be integer, got string" in wrong.text
    boolean = await tm.call(call("tb.add", a=True, b=2))
    assert boolean.error_kind == "bad_arguments"
    whole_float = await tm.call(call("tb.add", a=2.0, b=2))
    assert not whole_float.is_error and whole_float.text == "4"
    failed = await tm.call(call("tb.fail", message="disk on fire"))
    assert failed.is_error and failed.error_kind == "tool_error" and "disk on fire" in failed.text


async def test_call_many_keeps_order_and_runs_in_parallel_within_the_server_limit(tm):
    calls = [ToolCall(name="bounded.tracked_sleep", arguments={"ms": 150}, id=str(i)) for i in range(12)]
    calls.insert(5, call("tb.echo", text="x", times=3))
    results = await tm.call_many(calls)
    assert [r.id for r in results] == [c.id for c in calls]
    assert results[5].text == "xxx" and not any(r.is_error for r in results)
    now, most = (await tm.call(call("bounded.inflight"))).structured["result"]
    assert now == 0
    assert most == 3  # parallel (more than 1) and never more than max_concurrency


async def test_metrics_count_calls_errors_and_servers(tm):
    tm.reset_metrics()
    await tm.call_many([call("tb.add", a=1, b=1), call("tb2.add", a=1, b=1), call("tb.add", a=1),
                        call("nope")])
    m = tm.metrics()
    assert m["tools/calls"] == 4 and m["tools/errors"] == 2
    assert m["tools/errors_bad_arguments"] == 1 and m["tools/errors_unknown_tool"] == 1
    assert m["tools/tb/calls"] == 2 and m["tools/tb/errors"] == 1 and m["tools/tb2/calls"] == 1
    assert m["tools/cache_hit_rate"] == 0.0 and m["tools/latency_mean_s"] > 0 and m["tools/restarts"] == 0
    assert 0 < m["tools/latency_p50_s"] <= m["tools/latency_p90_s"] <= m["tools/latency_p99_s"]
    tm.reset_metrics()
    assert tm.metrics()["tools/calls"] == 0


async def test_cache_with_real_redis(tmp_path, redis_server):
    cfg = write_config(tmp_path / "c.json", {"tb": toolbox_entry(cache_ttl_s=60)})
    cache = make_cache(CacheConfig(backend="redis", url=redis_server.url, namespace="t-mgr"), tmp_path / "x.rdb")
    async with ToolManager.from_files([cfg], cache=cache) as tm:
        first = await tm.call(call("slow_add", a=1, b=2, ms=50))
        again = await tm.call(ToolCall(name="slow_add", arguments={"b": 2, "ms": 50, "a": 1}, id="second"))
        assert (first.cached, again.cached) == (False, True)
        assert again.text == "3" and again.id == "second" and not again.is_error
        # not declared idempotent: never cached
        counts = [(await tm.call(call("count"))).text for _ in range(2)]
        assert counts == ["1", "2"]
        # errors are never cached
        errs = [await tm.call(call("fail", message="no")) for _ in range(2)]
        assert all(e.is_error and not e.cached for e in errs)
        # identical calls in flight together run once (single-flight)
        burst = await tm.call_many([call("slow_add", a=5, b=5, ms=200) for _ in range(5)])
        assert {r.text for r in burst} == {"10"} and tm._flight.joined >= 4
        # the servers learn where the cache lives, for @redis_cache
        assert (await tm.call(ToolCall(name="getenv", arguments={"name": CACHE_URL_ENV}))).text == cache.url
        m = tm.metrics()
        assert m["tools/calls"] == 12 and m["tools/cache_hit_rate"] == pytest.approx(1 / 12)
    await cache.close()


async def test_streamable_http_server(tmp_path, free_port):
    web = HttpToolbox(free_port)
    web.start()
    try:
        cfg = write_config(tmp_path / "h.json", {"web": {"url": web.url, "headers": {"X-Test": "1"}}})
        async with ToolManager.from_files([cfg]) as tm:
            assert tm.resolve("add").server == "web"
            results = await tm.call_many([call("add", a=i, b=1) for i in range(20)])
            assert [r.text for r in results] == [str(i + 1) for i in range(20)]
            assert (await tm.call(call("echo", text="hi"))).text == "hi"
            sent = await tm.call(ToolCall(name="header", arguments={"name": "X-Test"}))
            assert sent.text == "1"  # the config's headers reach the server
    finally:
        web.kill()


async def test_sessions_spread_calls_and_close_leaves_no_children(tmp_path):
    before = child_pids()
    cfg = write_config(tmp_path / "s.json", {"tb": toolbox_entry(sessions=2)})
    async with ToolManager.from_files([cfg]) as tm:
        pids = set(tm.servers["tb"].pids)
        assert len(pids) == 2 and pids <= child_pids()
        seen = {(await tm.call(call("pid"))).text for _ in range(4)}
        assert {int(p) for p in seen} == pids
    assert not any(alive(p) for p in pids)
    assert not leftover_children(before)


async def test_a_huge_output_is_cut_at_the_manager_and_says_so(tmp_path):
    """Uncapped, 1 MB of output became ~1 M tokens in the rollout; the cap cuts it before anything reads it, at a
    character boundary, and the model is told how much it lost."""
    cfg = write_config(tmp_path / "c.json", {"tb": toolbox_entry(max_output_bytes=1000)})
    async with ToolManager.from_files([cfg]) as tm:
        big = await tm.call(ToolCall(name="echo", arguments={"text": "x", "times": 1_000_000}))
        wide = await tm.call(ToolCall(name="echo", arguments={"text": "\u00e9", "times": 100_000}))  # 2 bytes each
        small = await tm.call(ToolCall(name="echo", arguments={"text": "ok", "times": 3}))
    assert not big.is_error and big.text.startswith("x" * 1000)
    assert "output cut: 999000 of 1000000 bytes dropped, over this server's max_output_bytes (1000)" in big.text
    assert len(big.text.encode()) < 1200
    assert wide.text.startswith("\u00e9" * 500) and "output cut: 199000 of 200000 bytes" in wide.text
    assert small.text == "okokok"
