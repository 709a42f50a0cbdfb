"""One row of metrics.jsonl for a training step, built the same way by every engine: the local engine's two loops
and verl's run folder (`step_row`).

A row holds the step, its horizon (and ScalingInter-RL stage), `reward/*` (the RewardSet's, combined over the step),
`rollout/*` (of the step's trajectories), `tools/*` (the step's tool calls, from counters) and whatever parts the
engine adds (`loss/*`, `perf/*`, `async/*`, `off_policy/*`, verl's own names). Every key has its entry (meaning,
unit, engines) in metric_names.py, which the writer checks rows against. Left out: writing it (metrics.py).
"""
from __future__ import annotations

from typing import Any, Iterable

from rlfactory.rollout.metrics import rollout_metrics
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.tools.counters import tool_metrics


def step_row(step: int, *, trajectories: list[Trajectory], reward: dict[str, float], horizon: int,
             horizon_stage: int, rollout: dict[str, float] | None = None, tools: dict[str, Any] | None = None,
             parts: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The row of `step` (1-based: optimizer steps taken). `rollout`: the `rollout/*` (and `tools/*`) metrics when
    the caller has them already (an AgentLoop batch measures its wall time too), else computed from `trajectories`;
    `tools`: the step's tool counters (`tools/counters.py` shape); `parts` are added last, in order."""
    row: dict[str, Any] = {"step": step, "horizon": horizon, "horizon_stage": horizon_stage}
    row.update(reward)
    row.update(rollout if rollout is not None else rollout_metrics(trajectories))
    if tools is not None:
        row.update(tool_metrics(tools))
    for part in parts:
        row.update(part)
    return row
