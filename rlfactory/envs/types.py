"""The one record an environment step returns, and the protocol every environment here follows.

`StepResult.to_structured()` is what the MCP servers put in a tool result's structured content: the AgentLoop ends
the trajectory when it sees `done: true` there, and `rewards/env.py` reads `reward` / `score` from it.
"""
from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from rlfactory.errors import RLFactoryError


class EnvError(RLFactoryError):
    """An environment could not do what was asked (its server is unreachable or answered with an error). The MCP
    env servers answer it as an error result carrying the message, never as an observation: a failed `reset`
    makes the trajectory an error (counted in `rollout/errors`), a failed `step` is a tool error the policy sees."""

    infra = False
    """True when the failure is the infrastructure's (the environment's server is unreachable), not the
    environment's answer: the error result is then marked so (`ToolResult.infra`) and kept out of the loss."""


class StepResult(BaseModel):
    """What the agent sees after `reset` or `step`."""

    observation: str
    """Text the policy reads."""
    reward: float = 0.0
    """Reward of this step (AgentGym convention: the env's own reward, 1.0 on success for most envs)."""
    score: float = 0.0
    """Episode score so far in [0, 1] (what `rewards/env.py` scores by default)."""
    done: bool = False
    """The episode is over: the trajectory should end."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Extra environment facts (e.g. valid actions, goal), not shown to the policy."""

    def render(self) -> str:
        """The text content of a tool result: a status line, then the observation. The status line comes first so
        it survives the AgentLoop's default (keep-the-start) truncation of long observations; `rewards/env.py`
        falls back to it when a record has no structured content."""
        return f"{self.status_line()}\n{self.observation}"

    def status_line(self) -> str:
        return f"[reward={self.reward:g} score={self.score:g} done={str(self.done).lower()}]"

    def to_structured(self, **extra: Any) -> dict[str, Any]:
        return {"observation": self.observation, "reward": self.reward, "score": self.score, "done": self.done,
                **extra}


class Env(Protocol):
    """One episode of one environment. Not thread-safe: the registry gives each episode to one caller at a time."""

    def reset(self, task_id: int) -> StepResult: ...

    def step(self, action: str) -> StepResult: ...

    def observe(self) -> str: ...

    def close(self) -> None: ...
