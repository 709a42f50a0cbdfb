"""The MCP server the tool benchmark calls: a trivial tool (for per-call overhead) and a 100 ms sleeping tool, in
a read-only/idempotent (cacheable) and a non-cacheable variant. Run by `bench/tools.py`; stdio only.

Tools return plain text (`structured_output=False`): no output schema, so the SDK's `call_tool` baseline does no
client-side output validation either, and the overhead comparison measures the ToolManager's own cost."""
from __future__ import annotations

import asyncio

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

app = MCPServer("bench", version="1.0", log_level="WARNING")


@app.tool(structured_output=False)
def echo(text: str) -> str:
    """Return `text` unchanged (the cheapest possible call)."""
    return text


@app.tool(structured_output=False)
async def sleep_ms(ms: int) -> str:
    """Sleep `ms` milliseconds without blocking the server (not cacheable)."""
    await asyncio.sleep(ms / 1000)
    return f"slept {ms} ms"


@app.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True), structured_output=False)
async def lookup(key: str, ms: int = 100) -> str:
    """A slow read-only, idempotent lookup: sleeps `ms` milliseconds, returns a value derived from `key`."""
    await asyncio.sleep(ms / 1000)
    return f"value of {key}"


if __name__ == "__main__":
    app.run()
