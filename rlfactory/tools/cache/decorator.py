"""`@redis_cache` for tool authors: cache an expensive function inside an MCP server, in the run's Redis.

    from rlfactory import redis_cache

    @redis_cache(ttl_s=24 * 3600, version="v2")
    def fetch_page(url: str) -> str:          # sync or async
        ...

Use it for work *behind* a tool that is worth reusing even when the tool as a whole is not idempotent (a web
API call, a slow lookup). Where the cache lives: the `RLFACTORY_CACHE_URL` environment variable, which the
ToolManager sets for every server it starts (the URL of the run's cache: `redis://…` or the embedded cache's
`unix://…` socket), with `RLFACTORY_CACHE_NAMESPACE` as the key prefix. Set them yourself to run a server by hand
against a Redis. When no URL is set, or Redis is unreachable, the decorator is a transparent pass-through: the
function runs as if undecorated (one warning per outage; Redis is tried again after `retry_interval_s`). A full
Redis (`maxmemory` under `noeviction`) still serves what it holds; new values are not stored, with one warning naming
the fix (see `health.py`).

Key discipline (as for tool results): sha256 of the canonical JSON of (namespace — by default the function's
module-qualified name —, the call's arguments bound to the signature with defaults applied, `version`). Bump
`version` when the function's behaviour changes. What is cached: return values that are JSON values and come
back equal from JSON (dict, list, str, int, float, bool, None — not tuples or objects); anything else, and every
exception, is returned or raised as usual and not stored. Calls whose arguments have no stable text (e.g. `self`
of a method) are not cached.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import weakref
from typing import Any, Callable, TypeVar

from rlfactory.tools.cache.base import CACHE_NAMESPACE_ENV, CACHE_URL_ENV, CacheStats, function_key
from rlfactory.tools.cache.health import BackendHealth, Kind

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_TIMEOUT_S = 1.0


class _Backend:
    """Clients for one Redis URL (a sync one, and an async one per event loop) and its health."""
    def __init__(self, url: str, retry_interval_s: float):
        from rlfactory.tools.cache.redis_backend import redact  # noqa: PLC0415

        self.url = url
        self.retry_interval_s = retry_interval_s
        self._sync: Any = None
        self._async: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.health = BackendHealth("@redis_cache: Redis", redact(url), "functions run uncached", logger,
                                    retry_interval_s=retry_interval_s)

    def available(self, kind: Kind) -> bool:
        return self.health.allows(kind)

    def failed(self, kind: Kind, error: BaseException) -> None:
        self.health.failed(kind, error)

    def succeeded(self, kind: Kind) -> None:
        self.health.succeeded(kind)

    def sync_client(self) -> Any:
        if self._sync is None:
            import redis  # noqa: PLC0415
            from redis.backoff import NoBackoff  # noqa: PLC0415
            from redis.retry import Retry  # noqa: PLC0415

            self._sync = redis.Redis.from_url(self.url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S,
                                              retry=Retry(NoBackoff(), 1))
        return self._sync

    def async_client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            from rlfactory.tools.cache.redis_backend import make_client  # noqa: PLC0415

            client = self._async[loop] = make_client(self.url, max_connections=16, socket_timeout_s=_TIMEOUT_S)
        return client


_backends: dict[str, _Backend] = {}


def _backend(url: str | None, retry_interval_s: float) -> _Backend | None:
    url = url or os.environ.get(CACHE_URL_ENV) or None
    if url is None:
        return None
    backend = _backends.get(url)
    if backend is None:
        backend = _backends[url] = _Backend(url, retry_interval_s)
    return backend


def _encode(value: Any) -> bytes | None:
    """JSON text of a value that survives the round trip unchanged, else None (not cacheable)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
    if json.loads(text) != value:
        return None  # e.g. a tuple (back as a list) or a dict with int keys (back with str keys)
    return text.encode()


def _decode(raw: bytes) -> tuple[bool, Any]:
    try:
        return True, json.loads(raw)
    except ValueError:
        return False, None  # not written by us: treat as a miss


def _outage_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError  # noqa: PLC0415

    return (RedisError, OSError, TimeoutError)


def redis_cache(
    ttl_s: float | None = 3600.0,
    *,
    namespace: str | None = None,
    version: str = "",
    url: str | None = None,
    retry_interval_s: float = 1.0,
) -> Callable[[F], F]:
    """Cache a sync or async function's results in Redis (see the module docstring).

    ttl_s: lifetime of an entry in seconds (None: no expiry). namespace: key group, by default the function's
    module-qualified name. version: part of every key; change it when the function's results change.
    url: a Redis URL overriding `RLFACTORY_CACHE_URL` (mostly for tests).
    """
    if ttl_s is not None and ttl_s <= 0:
        raise ValueError(f"redis_cache(ttl_s={ttl_s}): ttl_s must be positive, or None for no expiry")

    def decorate(fn: F) -> F:
        group = namespace or f"{fn.__module__}.{fn.__qualname__}"
        signature = inspect.signature(fn)
        stats = CacheStats()
        px = max(1, int(ttl_s * 1000)) if ttl_s is not None else None

        def key_for(args: tuple, kwargs: dict[str, Any]) -> str | None:
            try:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                digest = function_key(group, (), dict(bound.arguments), version)
            except (TypeError, ValueError):
                return None  # arguments with no stable text: run uncached
            prefix = os.environ.get(CACHE_NAMESPACE_ENV) or "rlfactory"
            return f"{prefix}:fn:{digest}"

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                backend = _backend(url, retry_interval_s)
                key = key_for(args, kwargs) if backend is not None else None
                if backend is None or key is None:
                    return await fn(*args, **kwargs)
                errors = _outage_errors()
                if backend.available("read"):
                    try:
                        raw = await backend.async_client().get(key)
                        backend.succeeded("read")
                    except errors as e:
                        stats.errors += 1
                        backend.failed("read", e)
                        raw = None
                    found, cached = _decode(raw) if raw is not None else (False, None)
                    if found:
                        stats.hits += 1
                        return cached
                stats.misses += 1
                value = await fn(*args, **kwargs)
                encoded = _encode(value)
                if encoded is not None and backend.available("write"):
                    try:
                        await backend.async_client().set(key, encoded, px=px)
                        stats.sets += 1
                        backend.succeeded("write")
                    except errors as e:
                        stats.errors += 1
                        backend.failed("write", e)
                return value

            async_wrapper.cache_stats = stats  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            backend = _backend(url, retry_interval_s)
            key = key_for(args, kwargs) if backend is not None else None
            if backend is None or key is None:
                return fn(*args, **kwargs)
            errors = _outage_errors()
            if backend.available("read"):
                try:
                    raw = backend.sync_client().get(key)
                    backend.succeeded("read")
                except errors as e:
                    stats.errors += 1
                    backend.failed("read", e)
                    raw = None
                found, cached = _decode(raw) if raw is not None else (False, None)
                if found:
                    stats.hits += 1
                    return cached
            stats.misses += 1
            value = fn(*args, **kwargs)
            encoded = _encode(value)
            if encoded is not None and backend.available("write"):
                try:
                    backend.sync_client().set(key, encoded, px=px)
                    stats.sets += 1
                    backend.succeeded("write")
                except errors as e:
                    stats.errors += 1
                    backend.failed("write", e)
            return value

        wrapper.cache_stats = stats  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
