"""Fixtures for the reward tests: a small builder of token-exact trajectories."""
from __future__ import annotations

import pytest

from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan


def build_trajectory(turn_texts: list[str], *, answer=None, calls=(), tid: str = "t0", assistant_len: int = 3,
                     tool_len: int = 2, task: dict | None = None) -> Trajectory:
    """Assistant turns of `assistant_len` policy tokens, separated by tool turns of `tool_len` masked tokens."""
    turns, mask, pos = [], [], 0
    for i, text in enumerate(turn_texts):
        turns.append(TurnSpan(role="assistant", start=pos, end=pos + assistant_len, text=text))
        mask += [1] * assistant_len
        pos += assistant_len
        if i < len(turn_texts) - 1:
            turns.append(TurnSpan(role="tool", start=pos, end=pos + tool_len, text="<tool_response>r</tool_response>"))
            mask += [0] * tool_len
            pos += tool_len
    row = dict(task) if task is not None else {"prompt": "What is 6*7?", "answer": answer}
    return Trajectory(id=tid, prompt_ids=[1, 2], response_ids=list(range(100, 100 + pos)), loss_mask=mask,
                      logprobs=[0.0] * pos, turns=turns, tool_calls=[ToolCallRecord(**c) for c in calls],
                      task=row, messages=[{"role": "user", "content": row.get("prompt", "")}])


@pytest.fixture
def make_traj():
    return build_trajectory


# ------------------------------------------------------------------ a real `rlfactory serve` subprocess
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402


class ServeProcess:
    """`rlfactory serve --tiny-random` on 127.0.0.1:port, started and stopped by the fixture."""

    def __init__(self, log_path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfactory.cli", "serve", "--tiny-random", "--host", "127.0.0.1",
             "--port", str(self.port), "--max-tokens", "64"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

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
