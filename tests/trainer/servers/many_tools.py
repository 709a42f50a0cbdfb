"""An MCP server (stdio) with many tools: `python many_tools.py --tools N` serves `lookup_0` ... `lookup_{N-1}`, each
with a described schema, so that the schemas alone outgrow a small context."""
from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("--tools", type=int, default=2000)
opts = parser.parse_args()
app = MCPServer("many", version="1.0", log_level="WARNING")


def make(i: int):
    def lookup(key: str, limit: int = 10) -> str:
        return f"{i}:{key}:{limit}"

    lookup.__name__ = f"lookup_{i}"
    lookup.__doc__ = f"Look `key` up in table number {i} and return at most `limit` matching rows."
    return lookup


for i in range(opts.tools):
    app.add_tool(make(i))

if __name__ == "__main__":
    app.run()
