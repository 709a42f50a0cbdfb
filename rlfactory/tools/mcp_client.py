"""The adapter to the MCP SDK's client: the ONLY module that imports `mcp.client` (streamable_http_client,
ClientSession); its stdio transport is `stdio_transport.py`.

`MCPConnection` is one long-lived session to one server (one subprocess for stdio). A dedicated owner task enters and
leaves the SDK's context managers, because anyio requires a cancel scope to be exited by the task that entered it;
callers from any task share the session. SDK objects are converted into our records (`ToolSpec`, `ToolResult`)
here, so the rest of rlfactory never sees mcp types.

Left out: restarts, limits and timeouts (`server.py`), name resolution and caching (`manager.py`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import tempfile
import uuid
from contextlib import AsyncExitStack
from typing import Any

import psutil
from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's client with MCP's timeouts

try:
    from builtins import BaseExceptionGroup
except ImportError:  # Python 3.10: anyio depends on the backport
    from exceptiongroup import BaseExceptionGroup  # type: ignore[no-redef]

import mcp_types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from rlfactory import __version__
from rlfactory.errors import ToolServerError
from rlfactory.tools.images import BadImage, ImageLimits, decode_image
from rlfactory.tools.mcp_configs import ServerConfig
from rlfactory.tools.stdio_transport import REPLY_TOO_LARGE, REPLY_UNREADABLE, base_environment, stdio_transport
from rlfactory.tools.types import INFRA_KEY, LOOP_ONLY_META, MAX_EPISODES_META, ToolImage, ToolResult, ToolSpec

log = logging.getLogger(__name__)

# Passed through to stdio servers on top of the SDK's short default list (HOME, PATH, …): the venv, thread caps,
# offline switches, and rlfactory's own settings (e.g. the cache URL for `@redis_cache`).
_PASSTHROUGH_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LANG", "LC_ALL", "TMPDIR",
                    "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")
_TAG_ENV = "RLFACTORY_SERVER_TAG"
_CLIENT_INFO = mcp_types.Implementation(name="rlfactory", version=__version__)
_STDERR_TAIL_CHARS = 2000


class ConnectionLost(Exception):
    """The session ended under a call (the server process died or the HTTP session was dropped)."""


def _content_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind == "resource":
        res = block.resource
        return getattr(res, "text", None) or f"[resource {res.uri}]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    # Audio (and images, where a caller asks for all blocks) cannot be shown as text: say what was returned.
    return f"[{kind} {getattr(block, 'mime_type', '')}]".replace(" ]", "]")


def to_tool_spec(tool: Any, server: str) -> ToolSpec:
    """An SDK `Tool` as our ToolSpec (named by its bare name; the manager qualifies it on collision)."""
    ann = tool.annotations
    return ToolSpec(
        name=tool.name,
        server=server,
        tool=tool.name,
        description=tool.description or "",
        input_schema=tool.input_schema or {"type": "object", "properties": {}},
        read_only=bool(ann and ann.read_only_hint),
        idempotent=bool(ann and ann.idempotent_hint),
        loop_only=isinstance(tool.meta, dict) and tool.meta.get(LOOP_ONLY_META) is True,
        max_episodes=_max_episodes(tool.meta),
    )


def _max_episodes(meta: Any) -> int | None:
    """A tool list's `_meta["rlfactory/max_episodes"]`, when it is a positive integer."""
    value = meta.get(MAX_EPISODES_META) if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def to_tool_result(result: Any, name: str, server: str, limits: ImageLimits | None = None) -> ToolResult:
    """An SDK `CallToolResult` as our ToolResult; its `ImageContent` blocks checked into `ToolResult.images`
    (`images.decode_image`). An image that cannot be used makes the call an error result (`bad_image`) whose text
    says why, before the tool's own text (so a result that is partly fine reads as the error lines, then the tool's
    words, not as the tool's words marked "Error:"); its usable images are kept. The model reads it, the cache does
    not keep it."""
    content = result.content
    text = content[0].text if len(content) == 1 and content[0].type == "text" else "\n".join(
        _content_text(b) for b in content if b.type != "image")
    is_error = bool(result.is_error)
    structured = result.structured_content
    infra = is_error and isinstance(structured, dict) and structured.get(INFRA_KEY) is True
    images, problems = _images(content, name, limits or ImageLimits())
    kind = "tool_error" if is_error else None
    if problems:
        text = "\n".join([*problems, text]) if text else "\n".join(problems)
        is_error, kind = True, kind or "bad_image"
    return ToolResult(name=name, text=text, is_error=is_error, error_kind=kind, server=server,
                      structured=structured, infra=infra, images=images)


def _images(content: list[Any], name: str, limits: ImageLimits) -> tuple[list[ToolImage], list[str]]:
    """The result's usable images, and an error line for each one refused."""
    images: list[ToolImage] = []
    problems: list[str] = []
    blocks = [b for b in content if b.type == "image"]
    if len(blocks) > limits.max_images:
        problems.append(f"Error: {name} returned {len(blocks)} images, over this server's max_images_per_result "
                        f"({limits.max_images}); the images were dropped")
        return images, problems
    for i, block in enumerate(blocks):
        try:
            images.append(decode_image(block.data, block.mime_type, limits))
        except BadImage as e:
            problems.append(f"Error: image {i + 1} of {name} could not be used: {e}")
    return images, problems


def error_result(name: str, server: str | None, kind: str, text: str, *, infra: bool = False) -> ToolResult:
    return ToolResult(name=name, text=text, is_error=True, error_kind=kind, server=server, infra=infra)


class MCPConnection:
    """One long-lived client session to one server. `open()` connects and initializes; `call()` may be used from
    any task; `close()` ends the session and, for stdio, the subprocess."""

    def __init__(self, cfg: ServerConfig, *, extra_env: dict[str, str] | None = None):
        self.cfg = cfg
        self.extra_env = extra_env or {}
        self.session: ClientSession | None = None
        self.server_info: dict[str, Any] = {}
        self.lost = False
        self._tag = uuid.uuid4().hex
        self._closing = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self._errlog: Any = None
        self._pid: int | None = None
        st = cfg.settings
        self._image_limits = ImageLimits(st.max_image_bytes, st.max_image_pixels, st.max_images_per_result)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def _transport(self) -> Any:
        cfg = self.cfg
        if cfg.transport == "http":
            return None
        env = {k: os.environ[k] for k in _PASSTHROUGH_ENV if k in os.environ}
        env.update({k: v for k, v in os.environ.items() if k.startswith("RLFACTORY_")})
        env.update(cfg.env)
        env.update(self.extra_env)
        env[_TAG_ENV] = self._tag
        # Server stderr goes to an anonymous file: kept quiet in the terminal, its tail explains a failed start.
        self._errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        return stdio_transport(cfg.command or "", list(cfg.args), env=base_environment() | env,
                               cwd=str(cfg.cwd) if cfg.cwd else None, errlog=self._errlog,
                               max_message_bytes=cfg.settings.max_message_bytes)

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with AsyncExitStack() as stack:
                if self.cfg.transport == "http":
                    read, write = await stack.enter_async_context(self._http_transport(stack))
                else:
                    read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write, client_info=_CLIENT_INFO))
                init = await session.initialize()
                info = init.server_info
                self.server_info = {"name": info.name, "version": info.version,
                                    "protocol": init.protocol_version}
                self.session = session
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as e:  # noqa: BLE001 - reported through `ready` or logged; the task must not die noisy
            if not ready.done():
                if isinstance(e, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(e)
            elif not isinstance(e, asyncio.CancelledError):
                log.debug("connection to %s ended with %r", self.cfg.name, e)
        finally:
            self.session = None
            self.lost = True

    def _http_transport(self, stack: AsyncExitStack) -> Any:
        client = create_mcp_http_client(headers=dict(self.cfg.headers) or None)
        stack.push_async_callback(client.aclose)
        return streamable_http_client(self.cfg.url or "", http_client=client)

    async def open(self, timeout_s: float) -> None:
        """Connect and initialize; raise ToolServerError (with the server's stderr tail) on failure."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(ready), name=f"mcp-{self.cfg.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout_s)
        except BaseException as e:
            if not ready.done():
                ready.cancel()  # nobody will read it now
            hint = self._stderr_hint()
            await self.close()
            if isinstance(e, asyncio.CancelledError):
                raise
            reason = f"did not start within {timeout_s:g} s" if isinstance(e, asyncio.TimeoutError) else _why(e)
            raise ToolServerError(f"server '{self.cfg.name}' ({self.cfg.describe()}) {reason}{hint}") from None

    async def close(self) -> None:
        """End the session; for stdio the SDK closes stdin, then terminates and kills the process if it lingers."""
        self._closing.set()
        owner, self._owner = self._owner, None
        if owner is not None and not owner.done() and self.session is None:
            # Not initialized yet: the owner is blocked inside the SDK (spawn or handshake), not on `_closing`.
            # Cancelling is safe: the SDK's process shutdown runs shielded.
            owner.cancel()
        if owner is not None and not owner.done():
            try:
                await asyncio.wait_for(asyncio.shield(owner), 15)
            except asyncio.TimeoutError:
                owner.cancel()  # the SDK's process shutdown runs shielded: the process still gets killed
                await asyncio.wait({owner}, timeout=5)
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None
        self.session = None
        self.lost = True

    async def kill(self) -> None:
        """End a hung server at once (SIGKILL), instead of the graceful close a wedged process would stall."""
        pid = self.pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        await self.close()

    # -- use -------------------------------------------------------------------------------------------------------
    async def list_tools(self) -> list[ToolSpec]:
        session = self._session()
        specs: list[ToolSpec] = []
        params = None
        while True:
            page = await session.list_tools(params=params)
            specs.extend(to_tool_spec(t, self.cfg.name) for t in page.tools)
            if not page.next_cursor:
                return specs
            params = mcp_types.PaginatedRequestParams(cursor=page.next_cursor)

    async def resource_uris(self) -> list[str]:
        """The URIs of the resources the server lists (empty when it serves none)."""
        session = self._session()
        uris: list[str] = []
        params = None
        while True:
            try:
                page = await session.list_resources(params=params)
            except MCPError as e:
                if e.code == mcp_types.METHOD_NOT_FOUND:  # a server without resources
                    return uris
                raise
            uris.extend(str(r.uri) for r in page.resources)
            if not page.next_cursor:
                return uris
            params = mcp_types.PaginatedRequestParams(cursor=page.next_cursor)

    async def read_text_resource(self, uri: str) -> str:
        """The text of resource `uri` (its text parts joined)."""
        result = await self._session().read_resource(uri)
        return "".join(getattr(c, "text", "") or "" for c in result.contents)

    async def call(self, tool: str, arguments: dict[str, Any], name: str, timeout_s: float) -> ToolResult:
        """Call a tool; a tool failure or a timeout is an error result; a dead session raises ConnectionLost."""
        session = self.session
        if session is None:
            raise ConnectionLost(f"server '{self.cfg.name}' is not connected")
        try:
            # `send_request` rather than `call_tool`: call_tool re-validates structured output against the tool's
            # output schema with jsonschema on every call (~20-30 % of the client's CPU per call); the policy reads
            # the text, so that check buys a rollout nothing. The timeout rides on the SDK's own per-request clock
            # (no extra timer per call), which also tells the server to cancel the request.
            result = await session.send_request(
                mcp_types.CallToolRequest(params=mcp_types.CallToolRequestParams(name=tool, arguments=arguments)),
                mcp_types.CallToolResult,
                request_read_timeout_seconds=timeout_s,
            )
        except MCPError as e:
            code = e.code
            if code == mcp_types.REQUEST_TIMEOUT:
                return error_result(name, self.cfg.name, "timeout",
                                    f"Error: {name} did not finish within {timeout_s:g} s")
            if code == mcp_types.CONNECTION_CLOSED:
                self.lost = True
                raise ConnectionLost(f"server '{self.cfg.name}' closed the connection{self._stderr_hint()}") from None
            if code in (REPLY_TOO_LARGE, REPLY_UNREADABLE):  # the tool's output, not the server, is at fault
                return error_result(name, self.cfg.name, "tool_error", f"Error: the output of {name} could not "
                                    f"be used: {e.error.message}")
            kind = "bad_arguments" if code == mcp_types.INVALID_PARAMS else "server_error"
            return error_result(name, self.cfg.name, kind, f"Error calling {name}: {e.error.message}")
        except (ConnectionError, OSError) as e:  # HTTP transport failures
            self.lost = True
            raise ConnectionLost(f"server '{self.cfg.name}': {e}") from None
        except ValueError as e:  # a result that is not a CallToolResult (pydantic's ValidationError)
            return error_result(name, self.cfg.name, "server_error", f"Error calling {name}: bad result: {e}")
        except Exception as e:  # noqa: BLE001 - a failed call is content for the model, never an exception
            log.debug("call to %s on %s failed", name, self.cfg.name, exc_info=True)
            return error_result(name, self.cfg.name, "server_error", f"Error calling {name}: {type(e).__name__}: {e}")
        return to_tool_result(result, name, self.cfg.name, self._image_limits)

    async def ping(self, timeout_s: float) -> bool:
        session = self.session
        if session is None:
            return False
        try:
            await asyncio.wait_for(session.send_ping(), timeout_s)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not healthy"
            return False

    def _session(self) -> ClientSession:
        if self.session is None:
            raise ConnectionLost(f"server '{self.cfg.name}' is not connected")
        return self.session

    @property
    def pid(self) -> int | None:
        """The stdio server's process id (found by the tag in its environment), None for HTTP or when gone."""
        if self.cfg.transport != "stdio" or self.session is None:
            return None
        if self._pid is None:
            me = psutil.Process()
            # direct children first: a wrapper command (npx, uvx, a shell) passes the tag on to its own children
            for child in [*me.children(), *me.children(recursive=True)]:
                try:
                    if child.environ().get(_TAG_ENV) == self._tag:
                        self._pid = child.pid
                        break
                except (psutil.Error, OSError):
                    continue
        return self._pid

    def stderr_tail(self) -> str:
        f = self._errlog
        if f is None:
            return ""
        try:
            f.flush()
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _STDERR_TAIL_CHARS * 4))
            return f.read()[-_STDERR_TAIL_CHARS:].strip()
        except (OSError, ValueError):
            return ""

    def _stderr_hint(self) -> str:
        tail = self.stderr_tail()
        return f"; server stderr:\n{tail}" if tail else ""


def _why(e: BaseException) -> str:
    """A one-line reason from an exception (the SDK raises ExceptionGroups out of its task groups)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, MCPError):
        return f"failed to initialize: {e.error.message}"
    if isinstance(e, FileNotFoundError):
        return f"could not be launched: {e}"
    return f"failed to start: {type(e).__name__}: {e}"
