"""Snippets that try to outlive their python-sandbox call, and the real sandbox server to run them in.

The sandbox runs them with processes allowed (`--allow-processes`, `Limits.allow_processes`: the audit hook's ban on
new processes off), so what is tested is the process-lifetime layer itself, as a snippet that may start processes,
or one that got around the CPython-level checks, meets it. Forked children keep the command line of the snippet's
interpreter, which names its scratch directory: every process of a snippet run by a server whose TMPDIR is `marker`
has `marker` in its command line.

Used by tests/tools/test_sandbox_escapes.py and bench/chaos_sandbox.py.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

SANDBOX = Path(__file__).resolve().parents[2] / "envs" / "tools" / "python_sandbox.py"

# fork(body, setsid=False): a child (in a session of its own with setsid) that runs body() and exits, with the parent's
# stdin/stdout/stderr; its pid.
KIT = r'''
import os, sys, time, signal

def fork(body, setsid=False):
    pid = os.fork()
    if pid == 0:
        try:
            if setsid:
                os.setsid()
            body()
        finally:
            os._exit(0)
    return pid

def detach():
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (the sandbox starts the snippet in a session of its own)

def sleep_for_ever():
    while True:
        time.sleep(1)

'''


def setsid_sleep(say_ready: bool = True) -> str:
    """The issue's snippet: the main process leaves its session and outsleeps the timeout. `say_ready=False`, for a
    server killed mid-call, writes a file `ready` in its working directory (the call's scratch) instead of its one
    print: a print after the server's end of the pipe closed would end the snippet with a BrokenPipeError, so whether
    it survives would depend on how fast it reached its print (`snippet_ready` finds the file)."""
    ready = "print('ready', flush=True)\n" if say_ready else "open('ready', 'w').close()\n"
    return KIT + "detach()\n" + ready + "sleep_for_ever()\n"


def snippet_ready(marker: Path) -> bool:
    """Whether a `setsid_sleep(say_ready=False)` snippet of a server whose TMPDIR is `marker` has detached and is
    sleeping: its scratch (`<marker>/rlf-python-*/work`) holds `ready`. A process naming `marker` may still be the
    call's wrapper starting up."""
    return any(marker.glob("rlf-python-*/work/ready"))


def double_fork() -> str:
    """A daemon: a child in a new session forks a grandchild that keeps stdout/stderr and sleeps; the main process
    exits at once (0), so the call should return at once with its output."""
    return KIT + ("def grandchild():\n    sleep_for_ever()\n"
                  "def child():\n    detach()\n    fork(grandchild)\n"
                  "pid = fork(child)\nos.waitpid(pid, 0)\nprint('ready', flush=True)\n")


def closed_pipes(main_exits: bool = False) -> str:
    """The issue's second form: stdout and stderr closed after setsid, by the main process and by a detached child,
    so nothing keeps the pipes open and the main process (unless `main_exits`) outsleeps the timeout."""
    end = "" if main_exits else "detach()\nos.close(1)\nos.close(2)\nsleep_for_ever()\n"
    return KIT + ("def child():\n    detach()\n    os.close(0)\n    os.close(1)\n    os.close(2)\n"
                  "    sleep_for_ever()\n"
                  "fork(child)\nprint('ready', flush=True)\n" + end)


def ignores_sigterm(main_exits: bool = False) -> str:
    """A child in its own session that ignores SIGTERM and SIGHUP (a polite stop would not end it)."""
    end = "" if main_exits else "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ndetach()\nsleep_for_ever()\n"
    return KIT + ("def child():\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                  "    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n    sleep_for_ever()\n"
                  "fork(child, setsid=True)\nprint('ready', flush=True)\n" + end)


def fork_bomb() -> str:
    """Every process forks for ever, each child in a session of its own; only RLIMIT_NPROC (a per-snippet uid)
    stops it. Never run it where the snippet has no uid of its own."""
    return KIT + ("def bomb():\n    while True:\n        try:\n            fork(bomb, setsid=True)\n"
                  "        except OSError:\n            time.sleep(0.05)\n"
                  "fork(bomb, setsid=True)\nprint('ready', flush=True)\ndetach()\nsleep_for_ever()\n")


def process_tree(depth: int, width: int) -> str:
    """A bounded bomb (width**depth leaves), every process detached, for sandboxes without a process cap."""
    return KIT + (f"def node(level):\n    if level < {depth}:\n        for _ in range({width}):\n"
                  "            fork(lambda: node(level + 1), setsid=True)\n    sleep_for_ever()\n"
                  "fork(lambda: node(1), setsid=True)\nprint('ready', flush=True)\ndetach()\nsleep_for_ever()\n")


def alive_with(marker: str) -> list[str]:
    """Live processes whose command line contains `marker` ("pid: command line"), this process excepted."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.pid == psutil.Process().pid or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(p.info["cmdline"] or ())
        except psutil.Error:
            continue
        if marker in line:
            out.append(f"{p.pid}: {line[:200]}")
    return out


class SandboxServer:
    """The python sandbox MCP server over streamable HTTP on 127.0.0.1:port, with TMPDIR=marker (so every snippet's
    scratch directory, and so every process of its snippets, names `marker`). Stopped by `stop`."""

    def __init__(self, port: int, marker: Path, disable: tuple[str, ...] = (), *args: str):
        self.port, self.marker, self.disable, self.args = port, marker, disable, args
        self.proc: subprocess.Popen | None = None
        self.log = marker / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, limit_s: float = 120) -> str:
        """Start and wait until it listens; the isolation it logged at start-up."""
        cmd = [sys.executable, str(SANDBOX), "--http", "--port", str(self.port), "--allow-processes", *self.args]
        for layer in self.disable:
            cmd += ["--disable", layer]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env={**os.environ, "TMPDIR": str(self.marker), "COLUMNS": "400"})
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandbox server exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"sandbox server did not listen on {self.port}: {self.log.read_text()}")
        said = [line for line in self.log.read_text().splitlines() if "python sandbox isolation: " in line]
        # rich's log handler ends the line with the file:line that logged it
        return re.sub(r"\s+\S+\.py:\d+\s*$", "", said[0].split("python sandbox isolation: ", 1)[1]) if said else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

