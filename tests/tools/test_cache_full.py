"""A full Redis (maxmemory reached under noeviction) behind the tool cache and `@redis_cache`: named as full with the
fix, told apart from an unreachable one, logged once rather than on every retry, and still serving what it holds.

Each test fills a real redis-server with `CONFIG SET maxmemory 1` (every write is refused with an OOM reply, reads
and PING still answer) and counts the log records."""
from __future__ import annotations

import asyncio
import logging

import pytest
import redis

from rlfactory import redis_cache
from rlfactory.tools.cache.base import CACHE_NAMESPACE_ENV, CACHE_URL_ENV, cache_key
from rlfactory.tools.cache.redis_backend import RedisCache
from rlfactory.tools.types import ToolResult

BACKEND_LOG = "rlfactory.tools.cache.redis_backend"
ROUNDS = 30


def ok(text: str = "42") -> ToolResult:
    return ToolResult(name="calculator", text=text, server="calc", latency_s=0.5)


def fill(raw: redis.Redis) -> None:
    raw.config_set("maxmemory-policy", "noeviction")
    raw.config_set("maxmemory", "1")  # bytes: already past it, so every write gets "OOM command not allowed"


def make_room(raw: redis.Redis) -> None:
    raw.config_set("maxmemory", "0")


def oom_replies(raw: redis.Redis) -> int:
    return int(raw.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


def records(caplog, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


async def test_a_full_redis_is_named_full_once_and_still_serves_hits(redis_server, caplog):
    raw = redis.Redis.from_url(redis_server.url)
    # retry_interval_s=0.01 and a longer sleep per round: the refused write is tried again every round, as it is
    # every second in a long run.
    cache = RedisCache(redis_server.url, namespace="full", retry_interval_s=0.01)
    held = cache_key("calc", "calculator", {"expression": "6*7"})
    try:
        await cache.set(held, ok(), ttl_s=None)
        fill(raw)
        caplog.set_level(logging.DEBUG, logger=BACKEND_LOG)
        for i in range(ROUNDS):
            hit = await cache.get(held)
            assert hit is not None and hit.cached and hit.text == "42"  # what it holds is still served
            fresh = cache_key("calc", "calculator", {"expression": f"{i}+1"})
            assert await cache.get(fresh) is None
            await cache.set(fresh, ok(str(i + 1)), ttl_s=60)  # refused by Redis: never raises
            await asyncio.sleep(0.02)
        assert oom_replies(raw) >= ROUNDS  # the writes were really tried again each round, not skipped for good
        warnings = records(caplog, BACKEND_LOG, logging.WARNING)
        assert len(warnings) == 1, warnings
        assert " is full (" in warnings[0] and "command not allowed when used memory" in warnings[0]
        assert "maxmemory" in warnings[0] and "maxmemory-policy allkeys-lru" in warnings[0]
        assert "unreachable" not in warnings[0]
        assert records(caplog, BACKEND_LOG, logging.INFO) == []  # no "back" line between refused writes
        assert cache.stats.hits == ROUNDS and cache.stats.sets == 1 and cache.stats.errors >= ROUNDS
        assert cache.health.condition == "full" and cache.health.changes == 1

        # Room again: the next write is stored, with one line saying so.
        make_room(raw)
        await asyncio.sleep(0.02)
        back = cache_key("calc", "calculator", {"expression": "room"})
        await cache.set(back, ok("room"), ttl_s=60)
        assert cache.stats.sets == 2 and (await cache.get(back)).text == "room"
        infos = records(caplog, BACKEND_LOG, logging.INFO)
        assert len(infos) == 1 and "stores results again" in infos[0]

        # Hovering at maxmemory (full, room, full, ...) inside the quiet period: counted, not warned about.
        for i in range(5):
            fill(raw)
            await asyncio.sleep(0.02)
            await cache.set(cache_key("s", "t", {"flap": i}), ok(), ttl_s=60)
            make_room(raw)
            await asyncio.sleep(0.02)
            await cache.set(cache_key("s", "t", {"flap": i, "room": True}), ok(), ttl_s=60)
        assert len(records(caplog, BACKEND_LOG, logging.WARNING)) == 1
        assert len(records(caplog, BACKEND_LOG, logging.INFO)) == 1
        assert cache.health.changes == 2 + 10
        # Once the quiet period is over, the next start is warned about again, with the count of the hidden ones.
        cache.health.quiet_s = 0.0
        fill(raw)
        await asyncio.sleep(0.02)
        await cache.set(cache_key("s", "t", {"after": 1}), ok(), ttl_s=60)
        warnings = records(caplog, BACKEND_LOG, logging.WARNING)
        assert len(warnings) == 2 and "recovered 5 more time(s) since the last warning" in warnings[1]

        # A Redis that is gone is a different condition, with its own warning.
        redis_server.stop()
        await asyncio.sleep(0.02)
        assert await cache.get(held) is None
        warnings = records(caplog, BACKEND_LOG, logging.WARNING)
        assert len(warnings) == 3 and " is unreachable (" in warnings[2] and "full" not in warnings[2]
        assert cache.health.condition == "unreachable"
    finally:
        await cache.close()
        raw.close()


async def test_a_full_redis_that_stays_full_logs_one_warning_over_many_retry_intervals(redis_server, caplog):
    """The reported case: before, each retry interval flipped "unreachable" / "reachable again" (a read succeeded,
    the next write failed). Now one warning, and the state stays full while reads succeed."""
    raw = redis.Redis.from_url(redis_server.url)
    cache = RedisCache(redis_server.url, retry_interval_s=0.0)
    try:
        assert await cache.ping()
        fill(raw)
        caplog.set_level(logging.INFO, logger=BACKEND_LOG)
        for i in range(ROUNDS):
            key = cache_key("s", "t", {"i": i})
            assert await cache.get(key) is None
            await cache.set(key, ok(), ttl_s=60)
            assert await cache.ping()  # a full Redis answers PING: it is not unreachable
        assert len(records(caplog, BACKEND_LOG, logging.WARNING)) == 1
        assert records(caplog, BACKEND_LOG, logging.INFO) == []
        assert cache.stats.sets == 0 and cache.stats.misses == ROUNDS
    finally:
        await cache.close()
        raw.close()


@pytest.fixture
def _no_inherited_cache_env(monkeypatch):
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)
    monkeypatch.delenv(CACHE_NAMESPACE_ENV, raising=False)


@pytest.mark.usefixtures("_no_inherited_cache_env")
def test_redis_cache_decorator_names_a_full_redis_once(redis_server, caplog):
    raw = redis.Redis.from_url(redis_server.url)
    ran: list[int] = []

    @redis_cache(ttl_s=60, url=redis_server.url, retry_interval_s=0.0)
    def square(x: int) -> int:
        ran.append(x)
        return x * x

    try:
        assert square(3) == 9  # stored while there is room
        fill(raw)
        caplog.set_level(logging.INFO, logger="rlfactory.tools.cache.decorator")
        for i in range(ROUNDS):
            assert square(3) == 9  # still a hit
            assert square(100 + i) == (100 + i) ** 2  # computed; not stored
        assert ran == [3, *range(100, 100 + ROUNDS)]
        warnings = records(caplog, "rlfactory.tools.cache.decorator", logging.WARNING)
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("@redis_cache: Redis at") and " is full (" in warnings[0]
        assert records(caplog, "rlfactory.tools.cache.decorator", logging.INFO) == []
        make_room(raw)
        assert square(7) == 49 and square(7) == 49
        assert ran[-1] == 7 and ran.count(7) == 1
        infos = records(caplog, "rlfactory.tools.cache.decorator", logging.INFO)
        assert len(infos) == 1 and "stores results again" in infos[0]
    finally:
        raw.close()
