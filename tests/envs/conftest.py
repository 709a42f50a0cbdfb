"""Helpers for the environment tests: a real MCP stdio session to one env server, and structured results."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

REPO = Path(__file__).resolve().parents[2]


class EnvSession:
    """A thin wrapper over mcp's ClientSession for calling env tools and reading their structured results."""

    def __init__(self, session: Any):
        self.session = session

    async def call(self, tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
        result = await self.session.call_tool(tool, arguments)
        assert not result.is_error, result.content
        return result.content[0].text, dict(result.structured_content or {})

    async def stats(self) -> dict[str, int]:
        res = await self.session.read_resource("rlfactory://episodes")
        return json.loads(res.contents[0].text)


@contextlib.asynccontextmanager
async def env_session(script: str, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[EnvSession]:
    import os

    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=[str(REPO / "envs" / "tools" / script), *args],
                                   cwd=str(REPO), env={**os.environ, **(env or {})})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield EnvSession(session)


@pytest.fixture
def open_env():
    """`async with open_env("textcraft.py") as env:` — a real env server subprocess over stdio."""
    return env_session
