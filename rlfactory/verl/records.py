"""What verl's agent-loop workers record about each trajectory, for the run folder the driver builds.

verl's trainer logs its own metrics (advantages, losses, timings, the rollout/actor probability agreement), but the
trajectories themselves, their rewards and the tool calls behind them live only in the agent-loop workers, which
may sit on other nodes. So each worker appends one JSON line per finished trajectory to
`<run>/rollouts/<attempt>/<node>-<pid>.jsonl`:

    {"global_step", "time", "node", "worker", "horizon", "trajectory": Trajectory, "reward_metrics": {...},
     "tool_counters": ToolManager.counters() of the worker after this trajectory}

`global_step` is verl's `global_steps` for the sample: the step it is trained at in the synchronous trainer, the
dataloader step that produced it in the asynchronous one (see `run_folder.records_by_step`).

`attempt` is fresh for every launch (a resumed run writes beside the killed one, never into it). The run-folder
writer (`run_folder.py`) reads them back by step. Left out: a shared file system between nodes, which a multi-node
run must provide for `<run>/` as it does for the recipe and the data.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from rlfactory.rollout.trajectory import Trajectory

ROLLOUTS_DIR = "rollouts"
ATTEMPT_ENV = "RLFACTORY_RUN_ATTEMPT"
"""Set by the launcher in every Ray worker's environment: the folder name of this launch's records."""


class RolloutRecorder:
    """Appends this process's trajectory records to its own file (one writer per file, a line flushed at a time)."""

    def __init__(self, run_dir: str | Path, node: str):
        attempt = os.environ.get(ATTEMPT_ENV, "unlaunched")
        folder = Path(run_dir) / ROLLOUTS_DIR / attempt
        folder.mkdir(parents=True, exist_ok=True)
        self.node = node
        self.path = folder / f"{node[:12]}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def write(self, *, global_step: int, horizon: int, trajectory: Trajectory,
              reward_metrics: dict[str, float] | None,
              tool_counters: dict[str, Any] | None) -> None:
        row = {"global_step": global_step, "time": time.time(), "node": self.node, "worker": os.getpid(),
               "horizon": horizon,
               "trajectory": trajectory.model_dump(mode="json"), "reward_metrics": reward_metrics,
               "tool_counters": tool_counters}
        line = json.dumps(row, ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)


def read_records(run_dir: str | Path, attempt: str) -> list[dict[str, Any]]:
    """Every complete record of one launch (a line still being written is skipped until it is whole)."""
    folder = Path(run_dir) / ROLLOUTS_DIR / attempt
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):
                    rows.append(json.loads(line))
    return rows
