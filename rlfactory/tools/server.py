"""Supervision of one configured tool server: its sessions, call limits, timeouts, and restarts.

A `ToolServer` keeps `settings.sessions` long-lived connections (processes, for stdio) and spreads calls over them,
at most `max_concurrency` in flight (semaphore) and optionally `rate_per_s` (asyncio-throttle). A call past
`tool_timeout_s` returns a timeout error result.

Failure handling — failed calls are results, never exceptions:
- crash: a connection that closes under a call (process killed, HTTP session dropped) fails its in-flight calls as
  `server_error` results and is restarted in the background with exponential backoff (0.1 s doubling to 10 s,
  reset by a successful call); later calls wait for the restart (within the restart's own bounds), then run
  with their own timeout. A call to an idempotent tool (`idempotentHint`) that the crash failed is run again once
  the server is back (`ToolResult.retried`). While a restart attempt is pending, calls wait for its outcome; only
  after `FAIL_FAST_AFTER` failed attempts in a row do they fail at once (a server that stays down).
- start-up: a server whose first start fails (its process killed while starting, say) is started again, up to
  `START_ATTEMPTS` times, before the run is told it cannot start.
- every failure of the infrastructure (lost, down, not back in time) is marked `ToolResult.infra`, so the trainer
  can keep it out of the loss; a call's own timeout is the tool's behaviour and is not.
- hang: after a timeout the server is pinged; a server that does not answer is treated as crashed (killed,
  restarted), so a tool that blocks its server's event loop cannot wedge a run.

Left out: tool-name resolution, argument checks, caching and metrics (`manager.py`); the SDK (`mcp_client.py`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asyncio_throttle import Throttler

from rlfactory.errors import ToolServerError
from rlfactory.tools.mcp_client import ConnectionLost, MCPConnection, error_result
from rlfactory.tools.mcp_configs import ServerConfig
from rlfactory.tools.types import ToolResult, ToolSpec

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 10.0
PING_TIMEOUT_MAX_S = 5.0
FAIL_FAST_AFTER = 3
"""Failed restart attempts in a row after which calls no longer wait for the next attempt."""
START_ATTEMPTS = 3
"""How many times a server's first start is tried before `start()` gives up."""


class _Slot:
    """One connection and its restart state."""
    __slots__ = ("conn", "ready", "attempted", "restart_task", "health_task", "failures", "failed_attempts",
                 "down_reason", "opening")

    def __init__(self, conn: MCPConnection):
        self.conn = conn
        self.ready = asyncio.Event()
        self.attempted = asyncio.Event()
        """Set (and replaced) each time a restart attempt fails: calls waiting for the restart learn it."""
        self.restart_task: asyncio.Task[None] | None = None
        self.health_task: asyncio.Task[None] | None = None
        self.failures = 0
        """Crashes since the last successful call: the exponent of the restart backoff."""
        self.failed_attempts = 0
        """Restart attempts that failed in a row (0 once one succeeds)."""
        self.down_reason: str | None = None
        """Why the last restart attempt failed (calls fail fast meanwhile)."""
        self.opening: MCPConnection | None = None
        """The connection a restart is opening now (closed by `close()`, so no process outlives the server)."""


class ToolServer:
    """One configured server, supervised. `start()` connects and lists tools; `call()` never raises for tool or
    server failures."""

    def __init__(self, cfg: ServerConfig, *, extra_env: dict[str, str] | None = None):
        self.cfg = cfg
        self.name = cfg.name
        self.settings = cfg.settings
        self.extra_env = extra_env
        self.tools: list[ToolSpec] = []
        self.server_info: dict[str, Any] = {}
        self.startup_s = 0.0
        self.restarts = 0
        """Restarts completed (a new process/session is up)."""
        self.restarts_begun = 0
        """Restarts begun (a lost or hung server detected): per-batch `tools/restarts` counts these, so a loss
        counts in the batch it happened in even when the restart finishes after that batch's metrics are read."""
        self._slots: list[_Slot] = []
        self._rr = 0
        self._closed = False
        self._timeout_s = self.settings.tool_timeout_s
        self._sem: asyncio.Semaphore | None = None
        self._throttler: Any = None

    def _new_connection(self) -> MCPConnection:
        return MCPConnection(self.cfg, extra_env=self.extra_env)

    async def start(self) -> None:
        """Open every session concurrently and list the tools; raise ToolServerError if the server cannot start."""
        t0 = time.perf_counter()
        self._sem = asyncio.Semaphore(self.settings.max_concurrency)
        if self.settings.rate_per_s is not None:
            rate = self.settings.rate_per_s
            limit = max(1, round(rate))
            self._throttler = Throttler(rate_limit=limit, period=limit / rate)
        conns = await self._open_sessions()
        try:
            self.tools = await asyncio.wait_for(conns[0].list_tools(), self.settings.startup_timeout_s)
        except Exception as e:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
            raise ToolServerError(f"server '{self.name}' failed to list its tools: {e!r}") from None
        self.server_info = conns[0].server_info
        self._slots = [_Slot(c) for c in conns]
        for slot in self._slots:
            slot.ready.set()
        self.startup_s = time.perf_counter() - t0

    async def _open_sessions(self) -> list[MCPConnection]:
        """`settings.sessions` open connections; a start that fails is tried again (`START_ATTEMPTS` in all)."""
        for attempt in range(1, START_ATTEMPTS + 1):
            conns = [self._new_connection() for _ in range(self.settings.sessions)]
            outcomes = await asyncio.gather(*(c.open(self.settings.startup_timeout_s) for c in conns),
                                            return_exceptions=True)
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            if not failed:
                return conns
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
            err = failed[0]
            if not isinstance(err, Exception):
                raise err
            if attempt == START_ATTEMPTS:
                raise err if isinstance(err, ToolServerError) else ToolServerError(f"server '{self.name}': {err!r}")
            log.warning("tool server '%s' failed to start (attempt %d of %d): %s; starting it again", self.name,
                        attempt, START_ATTEMPTS, str(err).splitlines()[0] if str(err) else repr(err))
            await asyncio.sleep(BACKOFF_FIRST_S * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    @property
    def connections(self) -> list[MCPConnection]:
        """The live connections (one per session), e.g. for a raw SDK baseline in benchmarks."""
        return [s.conn for s in self._slots]

    @property
    def pids(self) -> list[int]:
        return [p for s in self._slots if (p := s.conn.pid) is not None]

    @property
    def healthy(self) -> bool:
        return any(s.ready.is_set() for s in self._slots)

    def _pick(self) -> _Slot:
        slots = self._slots
        if len(slots) == 1:
            return slots[0]
        i = self._rr = (self._rr + 1) % len(slots)
        slot = slots[i]
        if not slot.ready.is_set():
            for other in slots:
                if other.ready.is_set():
                    return other
        return slot

    async def call(self, tool: str, arguments: dict[str, Any], name: str, *, idempotent: bool = False) -> ToolResult:
        """Run one call under the server's limits; failures come back as error results. `idempotent`: a call the
        server's crash failed is run once more when the server is back."""
        assert self._sem is not None, "ToolServer.start() was not awaited"
        async with self._sem:
            if self._throttler is not None:
                async with self._throttler:
                    pass
            result = await self._attempt(tool, arguments, name)
            if idempotent and result.infra and not self._closed:
                again = await self._attempt(tool, arguments, name)
                again.retried = True
                result = again
            return result

    async def _attempt(self, tool: str, arguments: dict[str, Any], name: str) -> ToolResult:
        slot = self._pick()
        if not slot.ready.is_set():
            waited = await self._wait_ready(slot, name)
            if waited is not None:
                return waited
        conn = slot.conn
        try:
            result = await conn.call(tool, arguments, name, self._timeout_s)
        except ConnectionLost as e:
            self._schedule_restart(slot, conn, str(e).split(";")[0])
            return error_result(name, self.name, "server_error",
                                f"Error: tool server '{self.name}' stopped during {name}; it is being restarted",
                                infra=True)
        if result.error_kind == "timeout":
            self._check_health(slot, conn)
        else:
            slot.failures = 0
        return result

    async def _wait_ready(self, slot: _Slot, name: str) -> ToolResult | None:
        """Wait for a restart in progress; an error result if it does not come back.

        The wait is bounded by the restart's own limits (its backoff, then `startup_timeout_s`), not by the call's
        `tool_timeout_s`: that one bounds the call once the server is up. A server's start-up time depends on the
        machine's load; a call must not fail because the restart it waits for took longer than the call would.
        A call that arrives while an attempt is pending waits for that attempt; once `FAIL_FAST_AFTER` attempts in
        a row have failed, calls fail at once."""
        bound_s = BACKOFF_MAX_S + self.settings.startup_timeout_s  # one attempt: its backoff, then its start-up
        while not slot.ready.is_set():
            if slot.failed_attempts >= FAIL_FAST_AFTER or self._closed:
                return error_result(name, self.name, "server_error",
                                    f"Error: tool server '{self.name}' is down ({slot.down_reason})", infra=True)
            attempted = slot.attempted
            ready, failed = asyncio.ensure_future(slot.ready.wait()), asyncio.ensure_future(attempted.wait())
            try:
                await asyncio.wait({ready, failed}, timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (ready, failed):
                    t.cancel()
            if not slot.ready.is_set() and not attempted.is_set():
                return error_result(name, self.name, "timeout", f"Error: tool server '{self.name}' was restarting "
                                    f"and not back within {bound_s:g} s", infra=True)
        return None

    # -- supervision -----------------------------------------------------------------------------------------------
    def _schedule_restart(self, slot: _Slot, conn: MCPConnection, reason: str, *, kill: bool = False) -> None:
        if self._closed or slot.conn is not conn or slot.restart_task is not None:
            return
        slot.ready.clear()
        self.restarts_begun += 1
        slot.restart_task = asyncio.create_task(self._restart(slot, reason, kill), name=f"restart-{self.name}")

    async def _restart(self, slot: _Slot, reason: str, kill: bool) -> None:
        log.warning("tool server '%s' lost (%s); restarting", self.name, reason)
        try:
            # in-flight calls on the old connection end now, as server_error results
            await (slot.conn.kill() if kill else slot.conn.close())
            while not self._closed:
                slot.failures += 1
                await asyncio.sleep(min(BACKOFF_FIRST_S * 2 ** (slot.failures - 1), BACKOFF_MAX_S))
                conn = slot.opening = self._new_connection()
                try:
                    await conn.open(self.settings.startup_timeout_s)
                except ToolServerError as e:
                    slot.down_reason = str(e).splitlines()[0]
                    slot.failed_attempts += 1
                    log.warning("restart of tool server '%s' failed: %s", self.name, e)
                    slot.attempted.set()  # wakes the calls waiting on this attempt
                    slot.attempted = asyncio.Event()
                    continue
                if self._closed:
                    await conn.close()
                    return
                slot.conn, slot.down_reason, slot.failed_attempts = conn, None, 0
                self.restarts += 1
                slot.ready.set()
                log.info("tool server '%s' restarted", self.name)
                return
        finally:
            slot.restart_task = slot.opening = None

    def _check_health(self, slot: _Slot, conn: MCPConnection) -> None:
        if self._closed or slot.health_task is not None or slot.conn is not conn:
            return

        async def probe() -> None:
            try:
                if not await conn.ping(min(PING_TIMEOUT_MAX_S, self._timeout_s)):
                    self._schedule_restart(slot, conn, "no answer to a ping after a call timed out (hung)", kill=True)
            finally:
                slot.health_task = None

        slot.health_task = asyncio.create_task(probe(), name=f"ping-{self.name}")

    async def close(self) -> None:
        """Stop supervision and end every session (for stdio: the processes)."""
        self._closed = True
        opening = [s.opening for s in self._slots if s.opening is not None]
        tasks = [t for s in self._slots for t in (s.restart_task, s.health_task) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # a restart cancelled while its process was starting: end that process too
        await asyncio.gather(*(c.kill() for c in opening), return_exceptions=True)
        await asyncio.gather(*(s.conn.close() for s in self._slots), return_exceptions=True)
        for s in self._slots:
            s.ready.clear()
