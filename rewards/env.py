"""Rewards that come from the environment itself (TextCraft, BabyAI, SciWorld, Deep Search, AgentGym bridge).

Environment servers (`rlfactory/envs/mcp_server.py`) return every step with structured content
`{observation, reward, score, done, ...}` and a text status line `[reward=R score=S done=D]`. These functions read
the LAST such tool result of the trajectory: from `ToolCallRecord.structured` when the AgentLoop recorded it, else
from the status line in the recorded text. A trajectory that never reached an environment scores 0.

Use in a recipe: `{function: env_score, weight: 1.0}` (or the dotted `rlfactory.rewards.env:env_score`).
Process rewards: `env_step_rewards` (the environment's own reward per turn) and `env_progress` (the rises of the
`progress` an environment reports beside its steps, e.g. the web environment's subgoal pages), each one value per
assistant turn, which the reward set places on that turn (and `algorithm.turn_credit` credits to it).
"""
from __future__ import annotations

import re
from typing import Any

_STATUS = re.compile(r"\[reward=(?P<reward>-?[\d.eE+-]+) score=(?P<score>-?[\d.eE+-]+) done=(?P<done>true|false)\]")


def env_status(record: Any) -> dict[str, Any] | None:
    """`{reward, score, done}` of one tool-call record, or None when it is not an environment step."""
    structured = getattr(record, "structured", None)
    if isinstance(structured, dict) and "score" in structured:
        return {"reward": float(structured.get("reward", 0.0)), "score": float(structured["score"]),
                "done": bool(structured.get("done", False))}
    m = _STATUS.search(getattr(record, "result", "") or "")
    if m is None:
        return None
    return {"reward": float(m["reward"]), "score": float(m["score"]), "done": m["done"] == "true"}


def _statuses(trajectory: Any) -> list[dict[str, Any]]:
    return [s for s in (env_status(r) for r in trajectory.tool_calls if not getattr(r, "is_error", False)) if s]


def env_score(trajectory: Any) -> float:
    """The environment's score at the end of the trajectory (in [0, 1] for the shipped environments)."""
    statuses = _statuses(trajectory)
    return statuses[-1]["score"] if statuses else 0.0


def env_success(trajectory: Any, threshold: float = 1.0) -> float:
    """1.0 when the environment finished the episode (`done`) with a score of at least `threshold`, else 0.0."""
    statuses = _statuses(trajectory)
    return float(bool(statuses) and statuses[-1]["done"] and statuses[-1]["score"] >= threshold)


def env_return(trajectory: Any) -> float:
    """Sum of the per-step rewards the environment handed out (AgentGym's undiscounted return)."""
    return float(sum(s["reward"] for s in _statuses(trajectory)))


def env_step_rewards(trajectory: Any) -> list[float]:
    """Environment reward per assistant turn (summed over the turn's calls), for process-reward experiments."""
    per_turn = [0.0] * max(1, trajectory.num_turns)
    for record in trajectory.tool_calls:
        status = env_status(record)
        if status and 0 <= record.turn < len(per_turn):
            per_turn[record.turn] += status["reward"]
    return per_turn


def env_progress(trajectory: Any) -> list[float]:
    """Per assistant turn, how far the turn's calls raised the `progress` the environment reports in its results'
    structured content (the share of the task's subgoals reached, in [0, 1]; the web environment reports it for
    tasks with `eval.subgoal_urls`). They sum to the highest progress the trajectory reached: a subgoal is paid once,
    on the turn that first reached it. A trajectory whose environment reports none scores 0 on every turn."""
    per_turn = [0.0] * max(1, trajectory.num_turns)
    best = 0.0
    for record in sorted(trajectory.tool_calls, key=lambda r: r.turn):
        structured = getattr(record, "structured", None)
        value = structured.get("progress") if isinstance(structured, dict) else None
        if getattr(record, "is_error", False) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if value > best and 0 <= record.turn < len(per_turn):
            per_turn[record.turn] += float(value) - best
            best = float(value)
    return per_turn
