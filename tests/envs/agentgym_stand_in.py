"""Real parts for the AgentGym bridge's tests and `bench/chaos_envs.py`: the stand-in AgentGym server as a
subprocess that can be killed and started again on the same port (as a restarted AgentGym server: ids from 0 again),
its instance table (`GET /rlfactory/instances`, which only the stand-in has), and the bridge as a subprocess spoken
to over MCP stdio by hand (JSON-RPC lines on its pipes), so that a session can end by `close`, by stdin EOF or by a
signal, and its process id is known."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "envs" / "tools" / "agentgym_http_server.py"
BRIDGE = REPO / "envs" / "tools" / "agentgym_bridge.py"
DEADLINE_S = 60.0
"""Hang guard for a server start or one MCP answer (never a timing assertion)."""


class StandIn:
    """The stand-in AgentGym server on 127.0.0.1:`port` (`args`: its options, e.g. `--flavor babyai`)."""

    def __init__(self, port: int, *args: str, log: Path | None = None):
        self.port = port
        self.args = args
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StandIn:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([sys.executable, str(STAND_IN), "--port", str(self.port), *self.args],
                                         cwd=REPO, stdout=out, stderr=out)
        finally:
            if self.log:
                out.close()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the stand-in server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/", timeout=1).status_code == 200:
                    self.starts += 1
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"the stand-in server did not answer on port {self.port} in {DEADLINE_S:.0f} s")

    def kill(self) -> None:
        """SIGKILL: every instance goes with it, as when an AgentGym server dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE_S)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def instances(self) -> list[int]:
        """The ids of the instances the server holds now."""
        return httpx.get(self.url + "/rlfactory/instances", timeout=10).json()["live"]

    def observation(self, env_id: int) -> Any:
        """Instance `env_id`'s observation as the server shows it (`GET /observation`: no side effect; a step, even
        `inventory`, would change what TextCraft shows)."""
        return httpx.get(self.url + "/observation", params={"id": env_id}, timeout=10).json()


class McpError(RuntimeError):
    pass


class BridgeProcess:
    """`envs/tools/agentgym_bridge.py` as a subprocess, with a bare MCP stdio client on its pipes."""

    def __init__(self, url: str, *extra: str, state_dir: Path | None = None, stderr: Path | None = None):
        args = [sys.executable, str(BRIDGE), "--url", url, "--env", "textcraft", "--timeout-s", "10", *extra]
        if state_dir is not None:
            args += ["--state-dir", str(state_dir)]
        err = open(stderr, "ab") if stderr else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            if stderr:
                err.close()
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next_id = 0
        self._request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "agentgym-stand-in-test", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        rid = self._next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise McpError(f"no answer to {method} in {DEADLINE_S:.0f} s") from None
            if line is None:
                raise McpError(f"the bridge exited ({self.proc.poll()}) before answering {method}")
            message = json.loads(line)
            if message.get("id") != rid:
                continue  # a notification (log message, progress)
            if "error" in message:
                raise McpError(f"{method}: {message['error']}")
            return message["result"]

    def call(self, tool: str, **arguments: Any) -> tuple[str, dict[str, Any], bool]:
        """(text, structured content, is_error) of one tool call."""
        result = self._request("tools/call", {"name": tool, "arguments": arguments})
        text = "".join(c.get("text", "") for c in result.get("content", []))
        return text, dict(result.get("structuredContent") or {}), bool(result.get("isError"))

    def end_by_eof(self) -> int:
        """Close stdin, as an MCP client ends a stdio session, and wait for the process."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=DEADLINE_S)

    def end_by_signal(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=DEADLINE_S)
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:  # the pipe's reader is gone
                pass
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE_S)
