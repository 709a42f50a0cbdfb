"""The one record an environment step returns, the protocol every environment here follows, and its errors (those of
an environment behind a server: `EnvServerError` and its kinds, raised by the AgentGym client and its sentinel).

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


class EnvServerError(EnvError):
    """The environment server could not be reached or answered with an error."""


class EnvUnreachable(EnvServerError):
    """The server could not be reached (connection refused, timeout): an infrastructure failure."""

    infra = True


class EnvInstanceLost(EnvServerError):
    """The episode's instance is gone or is not its own any more (the server restarted and may have given its id to
    another episode, or something else acted on it): nothing more is sent to it. An infrastructure failure."""

    infra = True


class EnvResetFailed(EnvServerError):
    """The episode's last reset failed, so it has no task on the server: the call was not sent. An infrastructure
    failure (the reset's own error says why)."""

    infra = True


class EnvReplyError(EnvServerError):
    """The server answered, with an error: `{"error": ...}` (AgentGym's way, HTTP 200) or a non-200 status.
    `message` is the server's own text."""

    def __init__(self, text: str, message: str):
        super().__init__(text)
        self.message = message


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
        """The structured content of the step's tool result: the step, `extra` (the server's: episode id, steps,
        state), the task id (None when the env gives none) and the `SHARED_INFO` fields the env gave."""
        return {"observation": self.observation, "reward": self.reward, "score": self.score, "done": self.done,
                **extra, "task_id": self.info.get("task_id"),
                **{k: self.info[k] for k in SHARED_INFO if k in self.info}}


SHARED_INFO = ("content_seed", "progress")
"""`StepResult.info` fields that reach the rollout side in a result's structured content (the rest of `info` stays in
the server): `content_seed`, the seed a generated world was built from, which a demonstrator needs to play its tasks'
plans (rlfactory/warmup/env_demos.py); `progress`, the share of the task's subgoals reached so far, in [0, 1] (the web
environment's pages on the way, TextCraft's craftable ingredients, the objects an AgentGym BabyAI mission names found:
`rewards/env.py`'s `env_progress` rewards its rises). Neither is shown to the policy."""


class Env(Protocol):
    """One episode of one environment. Not thread-safe: the registry gives each episode to one caller at a time.

    An environment may also define `state_key() -> str | None`: a string equal for equal states of the episode (None
    before a task), which the MCP server reports, hashed, as `state` with every reset and step (anchor-state turn
    credit groups turns by it: docs/algorithms.md), and `fork() -> Env`: a copy of the episode that goes on from the
    same state without touching this one (served as the loop-only `fork` tool; docs/environments.md, "Forking"), and
    `picture() -> bytes | None`: what the agent sees as a PNG, which the server shows after each result's text (a pixel
    view: BabyAI with `--view pixels`; rlfactory/envs/results.py)."""

    def reset(self, task_id: int) -> StepResult: ...

    def step(self, action: str) -> StepResult: ...

    def observe(self) -> str: ...

    def close(self) -> None: ...
