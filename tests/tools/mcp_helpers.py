"""Helpers for the tool-layer tests: configs for the misbehaving test server, child-process checks, HTTP servers."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from child_processes import live_children

SERVERS = Path(__file__).parent / "servers"
TOOLBOX = SERVERS / "toolbox.py"


def toolbox_entry(*extra_args: str, **settings) -> dict:
    entry: dict = {"command": "python", "args": [str(TOOLBOX), *extra_args]}
    if settings:
        entry["rlfactory"] = settings
    return entry


def write_config(path: Path, servers: dict) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def child_pids() -> set[int]:
    """Live (non-zombie) descendants of this test process."""
    return {p.pid for p in live_children()}


def leftover_children(before: set[int], limit_s: float = 30.0) -> dict[int, str]:
    """Descendants started since `before` that are still alive, with their command lines; {} when none.

    A server being stopped (stdin closed, then SIGTERM, then SIGKILL) can outlive the close that stopped it by a
    moment on a loaded machine. So this waits, up to `limit_s`, for the new ones to go: a process that has leaked
    stays past any wait, and one on its way out does not fail a test because the machine is busy."""
    deadline = time.monotonic() + limit_s
    while True:
        extra = child_pids() - before
        if not extra or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    out = {}
    for pid in extra:
        try:
            out[pid] = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class HttpToolbox:
    """The toolbox server over streamable HTTP on 127.0.0.1:port, as a subprocess this test owns."""

    def __init__(self, port: int):
        self.port = port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(TOOLBOX), "--http", str(self.port), "--name", "web"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"HTTP toolbox exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"HTTP toolbox did not listen on {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def inserted(old: str, new: str) -> str:
    """The one stretch of text `new` adds to `old`, after checking that everything else in `new` is `old`, byte for
    byte (what an edit that only adds must leave)."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < len(old) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    assert head + tail == len(old), f"text outside the added stretch changed:\n{old!r}\n->\n{new!r}"
    return new[head:len(new) - tail]
