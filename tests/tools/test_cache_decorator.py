"""`@redis_cache` for tool authors: sync and async functions, pass-through without Redis, outage and recovery,
key discipline, and a real MCP server process sharing the cache through RLFACTORY_CACHE_URL."""
from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest
import redis

from rlfactory import redis_cache
from rlfactory.tools.cache.base import CACHE_NAMESPACE_ENV, CACHE_URL_ENV

SERVER = Path(__file__).parent / "servers" / "h2_cached_server.py"


@pytest.fixture(autouse=True)
def _no_inherited_cache_env(monkeypatch):
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)
    monkeypatch.delenv(CACHE_NAMESPACE_ENV, raising=False)


def counting(**deco):
    """A decorated function and the list recording its real runs."""
    ran: list[tuple] = []

    @redis_cache(**deco)
    def square(x: int, scale: int = 1) -> dict:
        ran.append((x, scale))
        return {"value": x * x * scale}

    return square, ran


def test_sync_function_hits_after_first_call(redis_server):
    square, ran = counting(ttl_s=60, url=redis_server.url)
    assert square(3) == {"value": 9}
    assert square(3) == {"value": 9}
    # Positional, keyword and default-filled spellings of one call share a key.
    assert square(x=3, scale=1) == {"value": 9}
    assert square(3, 1) == {"value": 9}
    assert ran == [(3, 1)]
    assert square(3, scale=2) == {"value": 18}
    assert ran == [(3, 1), (3, 2)]
    assert (square.cache_stats.hits, square.cache_stats.misses) == (3, 2)
    assert square.__name__ == "square"  # functools.wraps keeps the schema MCP derives from the function


async def test_async_function(redis_server):
    ran = []

    @redis_cache(ttl_s=60, url=redis_server.url, namespace="fetch")
    async def fetch(page: str) -> str:
        ran.append(page)
        await asyncio.sleep(0.01)
        return f"<html>{page}</html>"

    assert await fetch("a") == "<html>a</html>"
    assert await fetch("a") == "<html>a</html>"
    assert await fetch("b") == "<html>b</html>"
    assert ran == ["a", "b"]


def test_url_comes_from_the_environment_and_namespace_prefix(redis_server, monkeypatch):
    monkeypatch.setenv(CACHE_URL_ENV, redis_server.url)
    monkeypatch.setenv(CACHE_NAMESPACE_ENV, "proj7")
    square, ran = counting(ttl_s=60)
    square(5)
    square(5)
    assert ran == [(5, 1)]
    keys = redis.Redis.from_url(redis_server.url).keys("*")
    assert len(keys) == 1 and keys[0].startswith(b"proj7:fn:")


def test_no_cache_configured_is_a_pass_through():
    square, ran = counting(ttl_s=60)
    assert square(2) == {"value": 4} and square(2) == {"value": 4}
    assert ran == [(2, 1), (2, 1)]
    assert square.cache_stats.misses == 0  # never consulted


def test_ttl_and_version_and_namespace_separate_entries(redis_server):
    a, ran_a = counting(ttl_s=1.0, url=redis_server.url, version="1")
    a(4)
    a(4)
    assert len(ran_a) == 1
    import time

    time.sleep(1.3)
    a(4)
    assert len(ran_a) == 2  # expired
    b, ran_b = counting(ttl_s=60, url=redis_server.url, version="2")
    b(4)
    assert len(ran_b) == 1  # another version never reads version 1's entries


def test_exceptions_and_non_json_results_are_not_cached(redis_server):
    calls = []

    @redis_cache(url=redis_server.url)
    def flaky(x: int):
        calls.append(x)
        if len(calls) == 1:
            raise RuntimeError("transient")
        return (x, x)  # a tuple would come back from JSON as a list: not cached

    with pytest.raises(RuntimeError):
        flaky(1)
    assert flaky(1) == (1, 1)
    assert flaky(1) == (1, 1)
    assert calls == [1, 1, 1]
    assert flaky.cache_stats.sets == 0


def test_unhashable_arguments_run_uncached(redis_server):
    ran = []

    @redis_cache(url=redis_server.url)
    def describe(obj) -> str:
        ran.append(obj)
        return type(obj).__name__

    thing = object()
    assert describe(thing) == "object" and describe(thing) == "object"
    assert len(ran) == 2
    # A set has a stable text (sorted), so it is cached.
    assert describe({3, 1}) == "set" and describe({1, 3}) == "set"
    assert len(ran) == 3


def test_outage_passes_through_with_one_warning_then_recovers(redis_server, caplog):
    square, ran = counting(ttl_s=60, url=redis_server.url, retry_interval_s=0.0)
    square(7)
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="rlfactory.tools.cache.decorator"):
        for _ in range(4):
            assert square(7) == {"value": 49}
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING][0].startswith(
        "@redis_cache: Redis at")
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1
    assert len(ran) == 5
    redis_server.start()
    square(7)  # miss (the restarted Redis is empty), stored
    square(7)  # hit
    assert len(ran) == 6


def test_bad_ttl_is_refused():
    with pytest.raises(ValueError, match="ttl_s must be positive"):
        redis_cache(ttl_s=0)


async def test_mcp_server_processes_share_the_cache(redis_server, repo_root):
    """Two real server processes: the second gets the first one's result from Redis without computing it."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {**os.environ, CACHE_URL_ENV: redis_server.url, "PYTHONPATH": str(repo_root)}

    async def lookup(word: str) -> str:
        params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("lookup", {"word": word})
            assert not result.is_error
            return result.content[0].text

    assert await lookup("tokamak") == "tokamak:7:computed_by_run=1:runs=1"
    # A fresh process (runs=0) answers from the cache: the value computed by the first process's run 1.
    assert await lookup("tokamak") == "tokamak:7:computed_by_run=1:runs=0"
