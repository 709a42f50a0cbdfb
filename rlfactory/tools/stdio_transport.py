"""The stdio transport to an MCP server process, part of the MCP adapter (`mcp_client.py` is its only user).

Why not the SDK's `stdio_client`: it joins every chunk to the line read so far (`(buffer + chunk).split("\\n")`), so
one 50 MB reply took 21 s of the event loop's time (every other trajectory stalled meanwhile) and 160 MB of memory
before any cap could apply. Here a reply is read in linear time, and one longer than `max_message_bytes` is never
held: its bytes are dropped as they arrive and its request is answered with an error (`REPLY_TOO_LARGE`) that says
how large it was. Lines that are not UTF-8 are decoded with replacement characters rather than ending the session.

Process handling follows the MCP lifecycle: the server runs in its own process group; on exit its stdin is closed,
it gets `EXIT_GRACE_S` to leave, then the group gets SIGTERM and, still alive, SIGKILL.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

log = logging.getLogger(__name__)

REPLY_TOO_LARGE = -32091
"""JSON-RPC error code (implementation-defined range, clear of the codes the SDK uses)
of a reply dropped for its size."""
REPLY_UNREADABLE = -32092
"""JSON-RPC error code of a reply that is not valid JSON-RPC (e.g. nested past the parser's depth limit)."""
EXIT_GRACE_S = 2.0
"""How long a server may take to exit after its stdin closes, and again after SIGTERM."""
_CHUNK = 1 << 16
_INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


def base_environment() -> dict[str, str]:
    """The variables every server inherits (those the MCP SDK passes by default), before the config's own."""
    return {k: v for k in _INHERITED_ENV if (v := os.environ.get(k)) is not None and not v.startswith("()")}


class _Lines:
    """Splits a byte stream into lines in linear time; a line past `limit` bytes is dropped as it arrives, keeping
    only its head (for the request id) and its length."""

    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.head = b""
        self.dropping = False

    def feed(self, chunk: bytes) -> list[bytes | tuple[bytes, int]]:
        """Complete lines in `chunk` (bytes), or (head, size) for each line that was too long."""
        out: list[bytes | tuple[bytes, int]] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._add(piece)
            if end < 0:
                return out
            out.append((self.head, self.size) if self.dropping else b"".join(self.parts))
            self.parts, self.size, self.head, self.dropping = [], 0, b"", False
            start = end + 1

    def _add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.dropping:
            return
        self.parts.append(piece)
        if self.size > self.limit:
            self.head = b"".join(self.parts)[:256]
            self.parts, self.dropping = [], True


def _error_reply(head: bytes, code: int, message: str) -> SessionMessage | None:
    """An error reply to the request whose id `head` (the start of a message) names; None when none can be read."""
    m = _ID.search(head)
    if m is None:
        return None
    raw = m.group(1).decode("utf-8", "replace")
    request_id: int | str = int(raw) if raw[0] != '"' else raw[1:-1]
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                                 error=mcp_types.ErrorData(code=code, message=message)))


def _too_large(head: bytes, size: int, limit: int) -> SessionMessage | None:
    """The error reply standing in for a dropped one (None when its id cannot be read: that request times out)."""
    reply = _error_reply(head, REPLY_TOO_LARGE, f"the server's reply was {size:,} bytes, over the {limit:,} bytes "
                                                f"this client reads from it (max_message_bytes); it was dropped unread")
    if reply is None:
        log.warning("dropped a %d-byte message from an MCP server (over %d bytes) whose id could not be read", size,
                    limit)
    return reply


def _parse(line: bytes) -> SessionMessage | Exception:
    """One message; a reply that cannot be read answers its request with an error instead of leaving it to time
    out. JSON with lone surrogates (a server's `json.dumps` of undecodable bytes) is read with them replaced."""
    text = line.decode("utf-8", errors="replace")
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except ValueError as e:  # pydantic's ValidationError
        error: Exception = e
    try:
        obj = json.loads(text)
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(_scrub(obj), by_name=False))
    except (ValueError, RecursionError):
        pass
    log.warning("an MCP server sent a message that is not JSON-RPC: %.200s", text)
    reason = str(error).splitlines()
    return _error_reply(line[:256], REPLY_UNREADABLE, "the server's reply could not be read: "
                        + " ".join(r.strip() for r in reason[:3])[:300]) or error


def _scrub(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    if isinstance(obj, dict):
        return {_scrub(k): _scrub(v) for k, v in obj.items()}
    return obj


@asynccontextmanager
async def stdio_transport(command: str, args: list[str], *, env: dict[str, str], cwd: str | None, errlog: TextIO,
                          max_message_bytes: int) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn the server and yield the (read, write) streams `mcp.ClientSession` takes."""
    process = await anyio.open_process([command, *args], env=env, cwd=cwd, stderr=errlog, start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        lines = _Lines(max_message_bytes)
        assert process.stdout is not None
        delivering = True  # once the session is gone, stdout is still read (and dropped) so the server can exit
        async with read_writer:
            while True:
                try:
                    chunk = await process.stdout.receive(_CHUNK)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    return
                for line in lines.feed(chunk) if delivering else ():
                    if isinstance(line, tuple):
                        message: SessionMessage | Exception | None = _too_large(*line, max_message_bytes)
                    else:
                        message = _parse(line) if line.strip() else None
                    if message is None:
                        continue
                    try:
                        await read_writer.send(message)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        delivering = False
                        break

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the end instead of a request waiting forever

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for s in (read_stream, write_stream, read_writer, write_reader):
                    await s.aclose()
            tg.cancel_scope.cancel()


async def _exited(process: Any, timeout_s: float) -> bool:
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None


async def _stop(process: Any) -> None:
    """Close stdin, give the server time to leave, then SIGTERM and SIGKILL its process group."""
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, EXIT_GRACE_S):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            if await _exited(process, EXIT_GRACE_S):
                break
        else:
            log.warning("MCP server process %d is still alive after SIGKILL; leaving it", process.pid)
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    if transport is not None:
        with suppress(PermissionError):
            transport.close()
