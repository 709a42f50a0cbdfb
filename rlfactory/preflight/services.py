"""What a recipe's tools need to be reachable, checked before any model loads: the mcpServers files (and the hint
for the configs that moved), each HTTP server accepting connections, and a Redis cache answering PING.

Starts no tool server: the check that needs the servers' tools (their schemas must fit the context) runs where they
start (`rollout_side.check_tool_schemas_fit`).
"""
from __future__ import annotations

from pathlib import Path

from rlfactory.errors import ConfigError
from rlfactory.recipe.schema import Recipe
from rlfactory.tools.mcp_configs import load_recipe_servers


def check_tools(r: Recipe, errors: list[str]) -> None:
    _check_cache(r, errors)
    if not r.tools.mcp_configs:
        if r.tools.servers or r.tools.server_settings or r.tools.server_args:
            errors.append("tools.servers / server_settings / server_args name servers, but tools.mcp_configs is empty")
        return
    missing = [p for p in r.tools.mcp_configs if not Path(p).is_file()]
    errors.extend(f"tools.mcp_configs: file not found: {p}{_moved_config_hint(p)}" for p in missing)
    if not missing:
        try:
            servers = load_recipe_servers(r.tools)
        except ConfigError as e:
            where = f"{e.file}: " if e.file else ""
            errors.extend(m if m.startswith("tools.") else f"tools.mcp_configs: {where}{m}" for m in e.problems)
        else:
            for cfg in servers.values():
                if cfg.transport == "http" and cfg.url and (problem := _http_problem(cfg.url)):
                    errors.append(f"tools.mcp_configs: {cfg.source}: server '{cfg.name}' ({cfg.url}): {problem}")


def _http_problem(url: str) -> str | None:
    """Why nothing accepts connections at an HTTP server's address (None when a TCP connection opens within 2 s):
    found before any model is loaded rather than when the run starts its tool servers."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        return None  # the config check reports malformed URLs
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=2.0):
            return None
    except OSError as e:
        return (f"nothing accepts connections at {parts.hostname}:{port} ({e.strerror or e}); start the server, or "
                f"leave it out of tools.servers")


def _check_cache(r: Recipe, errors: list[str]) -> None:
    if r.tools.cache.backend == "redis" and not r.tools.cache.url:
        errors.append("tools.cache.url: required when tools.cache.backend is redis (e.g. redis://127.0.0.1:6379/0)")
    elif r.tools.cache.backend == "redis":
        problem = _redis_problem(r.tools.cache.url)
        if problem:
            errors.append(f"tools.cache.url: {problem}")


def _redis_problem(url: str) -> str | None:
    """Why nothing usable answers at a Redis URL (None when a PING gets its answer within a second)."""
    import redis

    from rlfactory.tools.cache.redis_backend import redact

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
    except ValueError as e:
        return f"not a Redis URL ({e})"
    try:
        client.ping()
    except redis.RedisError as e:
        return (f"no Redis answers at {redact(url)} ({type(e).__name__}: {e}); start redis-server there, or set "
                f"tools.cache.backend to 'embedded' (the default) or 'none'")
    finally:
        client.close()
    return None


# The per-recipe copies that recipes/mcp/ held until the configs were merged: file -> (shared file, its servers).
MOVED_CONFIGS = {
    "calculator.json": ("mcp_configs/default.json", "calculator"),
    "calculator_python.json": ("mcp_configs/default.json", "calculator, python"),
    "deepsearch_search.json": ("mcp_configs/deepsearch.json", "deepsearch_search"),
    "env_textcraft.json": ("mcp_configs/envs.json", "textcraft"),
    "env_babyai.json": ("mcp_configs/envs.json", "babyai"),
    "env_sciworld.json": ("mcp_configs/envs.json", "sciworld"),
    "env_deepsearch.json": ("mcp_configs/envs.json", "deepsearch"),
    "env_webarena.json": ("examples/agentgym_bridge.json", "webarena"),
}


def _moved_config_hint(path: str) -> str:
    p = Path(path)
    if p.parent.name != "mcp" or p.name not in MOVED_CONFIGS:
        return ""
    shared, servers = MOVED_CONFIGS[p.name]
    return (f" (recipes/mcp/ was merged into shared files: use `mcp_configs: [../{shared}]` with "
            f"`servers: [{servers}]`)")
