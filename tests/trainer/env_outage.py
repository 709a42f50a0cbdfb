"""Environment outages for the trainer tests and `bench/chaos_outage.py`: the TextCraft environment server over HTTP
(a service a run reaches by URL, stopped and started again on its port), the CPU smoke recipe pointed at it, and
`rlfactory train` as a subprocess watched through its log and its metrics.jsonl."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "agentgym_textcraft_smoke.yaml"
HTTP_TEXTCRAFT = Path(__file__).parent / "servers" / "http_textcraft.py"
TRACEBACK = "Traceback (most recent call last)"


def pick_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpTextcraft:
    """The TextCraft environment server on 127.0.0.1:port/mcp, a subprocess this test owns; `kill` it for an
    outage, `start` it again on the same port to end it."""

    def __init__(self, port: int | None = None, name: str = "textcraft"):
        self.port = port or pick_free_port()
        self.name = name
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HTTP_TEXTCRAFT), "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60  # a hang guard: the server starts in about a second
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the TextCraft HTTP server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the TextCraft HTTP server did not listen on {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def entry(self) -> dict[str, Any]:
        return {"url": self.url, "rlfactory": {"cache": False, "tool_timeout_s": 30}}


def write_config(path: Path, servers: list[HttpTextcraft]) -> Path:
    path.write_text(json.dumps({"mcpServers": {s.name: s.entry() for s in servers}}))
    return path


def smoke_sets(config: Path, *, steps: int, max_outage_s: float, async_k: int = 0,
               servers: tuple[str, ...] = ("textcraft",)) -> list[str]:
    """`--set` overrides of the TextCraft smoke recipe: its environment `servers` from `config`, `steps` steps of
    2 prompts x 2 samples, a checkpoint every step."""
    return [f"tools.mcp_configs=[{config}]", f"tools.servers=[{','.join(servers)}]", f"trainer.total_steps={steps}",
            "trainer.prompts_per_step=2",
            "rollout.samples_per_prompt=2", "trainer.save_every_steps=1", "trainer.log.transcripts_per_step=0",
            f"trainer.max_env_outage_s={max_outage_s}", f"trainer.max_staleness_steps={async_k}"]


class TrainRun:
    """`rlfactory train RECIPE --output-dir OUT --set ...` in the background, its output in a log file."""

    def __init__(self, recipe: Path, out: Path, sets: list[str], *, resume: bool = False,
                 env: dict[str, str] | None = None):
        self.out = out
        self.log_path = out.parent / f"{out.name}{'-resume' if resume else ''}.log"
        cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(recipe), "--output-dir", str(out)]
        cmd += ["--resume"] if resume else []
        for s in sets:
            cmd += ["--set", s]
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                                     start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rows(self) -> list[dict[str, Any]]:
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line being written
                break
        return rows

    def wait_until(self, ready: Callable[[], Any], what: str, timeout_s: float = 300) -> Any:
        """Poll `ready()` until it is true (returned); fail when the run ends first or past the hang guard."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = ready()
            if got:
                return got
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (code {self.proc.returncode}) before {what}:\n"
                                     f"{self.log()[-4000:]}")
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {timeout_s:.0f} s:\n{self.log()[-4000:]}")

    def wait_for_log(self, pattern: str, what: str, timeout_s: float = 300) -> re.Match:
        return self.wait_until(lambda: re.search(pattern, self.log()), what, timeout_s)

    def finish(self, timeout_s: float = 300) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.stop()

    def stop(self) -> None:
        """End the run and everything it started (its own session), whatever state it is in."""
        if self.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
            self.proc.wait(30)
        self._log.close()


def summary_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())
