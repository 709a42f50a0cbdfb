"""Steps with nothing to train on, and outages of the servers behind them: the rule both local loops (synchronous
and asynchronous) follow when every trajectory of a step was hit by an infrastructure failure (a tool or
environment server down or lost under its calls, a rollout that raised).

Such a step says nothing about the policy, so it is skipped: no optimizer step, the policy version stays, no row
in metrics.jsonl; it is counted (`rollout/skipped_steps` on the next step's row, `rollout/skipped_steps_total`,
`skipped_steps` in summary.json) and a warning names the servers whose failures emptied it. Before the next step
the loop waits a little (`pause`: 1 s, doubling to 15 s), so a server that stays down costs a few prompts a
minute rather than the whole data set, and the ToolManager's restarts (tools/server.py) have time to bring it back.

Skipped steps in a row are an outage. Once one has lasted `trainer.max_env_outage_s`, the loop saves a checkpoint
and the run ends with `EnvOutageError` naming the servers and the way on (`--resume` once they are back). A step
where only some trajectories failed trains on the others, as always.

Left out: restarting servers (tools/server.py), the verl engine (its own batches, its own handling).
"""
from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from rlfactory.errors import ToolServerError
from rlfactory.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

PAUSE_FIRST_S = 1.0
PAUSE_MAX_S = 15.0
_SERVER_IN_TEXT = re.compile(r"tool server '([^']+)'")


class EnvOutageError(ToolServerError):
    """Every step failed for infrastructure reasons for longer than `trainer.max_env_outage_s`."""


class Verdict(enum.Enum):
    TRAIN = "train"
    SKIP = "skip"
    """Nothing to train on: skip the step and wait a little before the next."""
    STOP = "stop"
    """Nothing to train on for `trainer.max_env_outage_s`: checkpoint and stop the run."""


def nothing_to_train(trajectories: Iterable[Trajectory]) -> bool:
    """True when every trajectory was hit by an infrastructure failure (or there is none)."""
    return all(t.infra_failed for t in trajectories)


def failure_sources(trajectory: Trajectory) -> dict[str, str]:
    """What an infrastructure-failed trajectory blames (`server 'NAME'`, else `tool 'NAME'`, else `the rollout
    itself`), each with the first line of what it said: the tool layer's messages name the server (`tool server
    'NAME' ...`); failing that, the task's environment server, else the failed tool."""
    texts = [trajectory.error or ""] + [c.result for c in trajectory.tool_calls if c.infra]
    found: dict[str, str] = {}
    for text in texts:
        for name in _SERVER_IN_TEXT.findall(text):
            found.setdefault(f"server {name!r}", _first_line(text))
    if found:
        return found
    text = _first_line(next((t for t in texts if t), "no message"))
    env = (trajectory.task or {}).get("env") or ((trajectory.task or {}).get("metadata") or {}).get("env")
    if isinstance(env, dict) and env.get("server"):
        return {f"server {str(env['server'])!r}": text}
    calls = [c.name for c in trajectory.tool_calls if c.infra]
    return {f"tool {calls[0]!r}" if calls else "the rollout itself": text}


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + "…"


class OutageGuard:
    """Judges each step's trajectories (`judge`), counts the skipped steps, and says why a run stopped."""

    def __init__(self, max_outage_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_outage_s = max_outage_s
        self.clock = clock
        self.skipped_total = 0
        self._since_row = 0
        self._in_a_row = 0
        self._began: float | None = None
        self.sources: Counter[str] = Counter()
        """Trajectories each source (`failure_sources`: mostly servers) emptied, over the outage in progress."""
        self._said: dict[str, str] = {}

    def judge(self, trajectories: list[Trajectory], step: int) -> Verdict:
        """TRAIN, SKIP (nothing to train on), or STOP (nothing to train on for `max_outage_s`). `step`: the
        1-based number of the step being judged (for the log)."""
        if not nothing_to_train(trajectories):
            if self._in_a_row:
                logger.info("step %d has trajectories to train on again after %d skipped step(s)", step,
                            self._in_a_row)
            self._in_a_row, self._began = 0, None
            self.sources.clear()
            self._said.clear()
            return Verdict.TRAIN
        now = self.clock()
        if self._began is None:
            self._began = now
        self._in_a_row += 1
        self.skipped_total += 1
        self._since_row += 1
        for t in trajectories:
            for source, said in failure_sources(t).items():
                self.sources[source] += 1
                self._said[source] = said  # the newest: "is down (why)" rather than the first "stopped during"
        if now - self._began >= self.max_outage_s:
            return Verdict.STOP
        logger.warning("step %d skipped: all %d trajectories failed for infrastructure reasons (%s); nothing to "
                       "train on, so no update. Skipped in a row: %d, for %.0f s of at most %g s "
                       "(trainer.max_env_outage_s)", step, len(trajectories), self.describe(),
                       self._in_a_row, now - self._began, self.max_outage_s)
        return Verdict.SKIP

    async def pause(self, stopping: Callable[[], bool]) -> None:
        """Wait before the step after a skipped one (1 s, doubling to 15 s, never past the outage's bound);
        returns early when `stopping()` turns true (SIGTERM)."""
        assert self._began is not None
        left = self._began + self.max_outage_s - self.clock()
        deadline = self.clock() + max(0.0, min(PAUSE_FIRST_S * 2 ** (self._in_a_row - 1), PAUSE_MAX_S, left))
        while not stopping() and self.clock() < deadline:
            await asyncio.sleep(min(0.25, max(0.0, deadline - self.clock())))

    def row_metrics(self) -> dict[str, float]:
        """For a trained step's row: steps skipped since the previous row, and over the run."""
        out = {"rollout/skipped_steps": float(self._since_row),
               "rollout/skipped_steps_total": float(self.skipped_total)}
        self._since_row = 0
        return out

    def describe(self) -> str:
        """The outage's sources, most trajectories first, each with what it said last."""
        return "; ".join(f"{source}: {n} trajectories, e.g. {self._said[source]}"
                         for source, n in self.sources.most_common())

    def error(self, step: int, checkpoint: Path | None) -> EnvOutageError:
        """Why the run stopped: the servers, how long, the checkpoint and the way on."""
        lasted = self.clock() - (self._began if self._began is not None else self.clock())
        servers = [source.removeprefix("server ") for source in self.sources if source.startswith("server ")]
        names = " and ".join(servers) or "the servers"
        return EnvOutageError(
            f"environment outage: every trajectory of the last {self._in_a_row} step(s) failed for infrastructure "
            f"reasons for {lasted:.0f} s, past trainer.max_env_outage_s ({self.max_outage_s:g} s). Failing: "
            f"{self.describe()}. Nothing was trained after step {step}; its checkpoint is {checkpoint}. "
            f"Bring {names} back (`rlfactory tools list -c <its mcpServers file>` checks it), then run the same "
            f"command with --resume; raise trainer.max_env_outage_s to wait out longer outages.")
