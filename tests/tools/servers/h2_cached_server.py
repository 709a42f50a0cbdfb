"""Test-only MCP server whose tool does its work through a `@redis_cache` function.

`lookup(word)` returns how many times the expensive function really ran in this process; with the cache shared
through RLFACTORY_CACHE_URL, a repeated word (even from another server process) comes back without running it.
"""
from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from rlfactory import redis_cache

server = MCPServer("h2_cached", log_level="WARNING")
runs = {"count": 0}


@redis_cache(ttl_s=60, version="test")
def expensive(word: str) -> dict:
    runs["count"] += 1
    return {"word": word, "length": len(word), "computed_by_run": runs["count"]}


@server.tool()
def lookup(word: str) -> str:
    """Look up a word (the work behind it is cached with @redis_cache)."""
    result = expensive(word)
    return f"{result['word']}:{result['length']}:computed_by_run={result['computed_by_run']}:runs={runs['count']}"


if __name__ == "__main__":
    server.run()
