"""A test MCP server with tools that misbehave on purpose: sleep, hang, block the event loop, crash.

Run: `python toolbox.py` (stdio) or `python toolbox.py --http PORT` (streamable HTTP on 127.0.0.1:PORT/mcp).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
parser.add_argument("--name", default="toolbox")
parser.add_argument("--extra-tool", default=None, help="also expose a tool with this name (for collision tests)")
parser.add_argument("--slow-restart", nargs=2, metavar=("MARKER", "SECONDS"), default=None,
                    help="every start but the first (MARKER exists) sleeps SECONDS before serving")
parser.add_argument("--fail-starts", nargs=2, metavar=("COUNTER", "STARTS"), default=None,
                    help="starts numbered in STARTS (comma-separated, from 1; counted in the file COUNTER) exit "
                         "with status 3 before serving")
opts = parser.parse_args()
if opts.fail_starts:
    counter, starts = opts.fail_starts
    n = (int(open(counter).read()) if os.path.exists(counter) else 0) + 1
    with open(counter, "w") as f:
        f.write(str(n))
    if str(n) in starts.split(","):
        raise SystemExit(3)
if opts.slow_restart:
    marker, delay_s = opts.slow_restart
    if os.path.exists(marker):
        time.sleep(float(delay_s))
    else:
        open(marker, "w").close()

app = MCPServer(opts.name, version="1.0", log_level="WARNING")
PURE = ToolAnnotations(readOnlyHint=True, idempotentHint=True)
_counter = 0


@app.tool(annotations=PURE)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool(annotations=PURE)
def echo(text: str, times: int = 1) -> str:
    """Repeat `text` `times` times."""
    return text * times


@app.tool()
def count() -> int:
    """A stateful counter: not idempotent, so never cached."""
    global _counter
    _counter += 1
    return _counter


@app.tool(annotations=PURE)
async def slow_add(a: int, b: int, ms: int = 100) -> int:
    """Add after sleeping `ms` milliseconds (cacheable: read-only and idempotent)."""
    await asyncio.sleep(ms / 1000)
    return a + b


@app.tool()
async def sleep_ms(ms: int) -> str:
    """Sleep `ms` milliseconds without blocking the server."""
    await asyncio.sleep(ms / 1000)
    return f"slept {ms} ms"


_inflight = 0
_max_inflight = 0


@app.tool()
async def tracked_sleep(ms: int) -> int:
    """Sleep `ms` milliseconds, counting calls in flight; returns how many were in flight on entry."""
    global _inflight, _max_inflight
    _inflight += 1
    _max_inflight = max(_max_inflight, _inflight)
    try:
        await asyncio.sleep(ms / 1000)
        return _inflight
    finally:
        _inflight -= 1


@app.tool()
def inflight() -> list[int]:
    """[calls of tracked_sleep in flight now, the most ever in flight at once]."""
    return [_inflight, _max_inflight]


@app.tool()
def getenv(name: str) -> str:
    """An environment variable of this server process ('' when unset)."""
    return os.environ.get(name, "")


@app.tool()
def header(name: str, ctx: Context) -> str:
    """An HTTP request header of this call ('' on stdio or when absent)."""
    return (ctx.headers or {}).get(name.lower(), "")


@app.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@app.tool()
async def hang() -> str:
    """Never returns, but the server stays responsive."""
    await asyncio.Event().wait()
    return "unreachable"


@app.tool()
async def freeze(seconds: float = 600) -> str:
    """Blocks the server's event loop (a hung server: it cannot even answer a ping)."""
    time.sleep(seconds)
    return "thawed"


@app.tool()
def crash() -> str:
    """Kills this server process."""
    os._exit(17)


@app.tool(annotations=PURE)
def crash_once(marker: str) -> str:
    """Declared idempotent: the first call (no `marker` file yet) kills this server process under the call; later
    calls answer 'survived'."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(17)
    return "survived"


@app.tool()
def fail(message: str) -> str:
    """Raises a tool error with `message`."""
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError(message)


if opts.extra_tool:
    app.add_tool(lambda: f"{opts.name}:{opts.extra_tool}", name=opts.extra_tool, description="Collision test tool.")

if __name__ == "__main__":
    if opts.http:
        app.run("streamable-http", host="127.0.0.1", port=opts.http)
    else:
        app.run()
