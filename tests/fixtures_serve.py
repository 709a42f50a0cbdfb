"""A real `rlfactory serve --tiny-random` subprocess on a port the fixture picks (`served_model`): the LLM-judge
and serving tests talk to it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest


class ServeProcess:
    """`rlfactory serve --tiny-random` on 127.0.0.1:port, started and stopped by the fixture."""

    def __init__(self, log_path, *extra_args: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfactory.cli", "serve", "--tiny-random", "--host", "127.0.0.1",
             "--port", str(self.port), "--max-tokens", "64", *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def health(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=10).json()

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rlfactory serve exited: {open(self.log_path).read()[-2000:]}")
            try:
                self.health()
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"rlfactory serve not ready after {timeout_s} s: {open(self.log_path).read()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def served_model(tmp_path_factory):
    """One tiny random model served for all reward tests (the model emits junk; tests rely on structure)."""
    server = ServeProcess(tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
