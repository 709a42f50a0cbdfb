"""`RewardSet`: weighted reward functions scoring batches of trajectories (the package docstring says what a function
may ask for and return), and `token_level_rewards`, the scalar reward spread over a trajectory's tokens."""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfactory.errors import ConfigError
from rlfactory.recipe.rewards import RewardsConfig
from rlfactory.reward.functions import RewardFn, load_reward_functions
from rlfactory.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


class RewardValueError(TypeError):
    """A reward function returned something the reward set cannot use."""


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or isinstance(value, (int, float)):
        f = float(value)
        if math.isfinite(f):
            return f
    raise RewardValueError(f"{what} must be a finite number, got {value!r}")


@dataclass
class _Outcome:
    """What one function said about one trajectory."""

    score: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    steps: list[float] | None = None


def _interpret(fn: RewardFn, value: Any, traj: Trajectory) -> _Outcome:
    if isinstance(value, dict):
        comps = {f"{fn.name}/{k}": _as_float(v, f"{fn.name}['{k}']") for k, v in value.items() if k != "score"}
        if "score" in value:
            score = _as_float(value["score"], f"{fn.name}['score']")
            comps[fn.name] = score
        elif fn.weight != 0:
            raise RewardValueError(f"{fn.name} returned a dict without a 'score' key; add one (it is the trained "
                                   f"value) or give the function weight 0")
        else:
            score = 0.0
        return _Outcome(score, comps)
    if isinstance(value, (list, tuple)):
        steps = [_as_float(v, f"{fn.name}[{i}]") for i, v in enumerate(value)]
        if len(steps) != traj.num_turns:
            raise RewardValueError(f"{fn.name} returned {len(steps)} step rewards for {traj.num_turns} assistant "
                                   f"turns; return one per assistant turn")
        return _Outcome(sum(steps), {fn.name: sum(steps)}, steps)
    score = _as_float(value, f"{fn.name}'s result")
    return _Outcome(score, {fn.name: score})


def token_level_rewards(traj: Trajectory) -> list[float]:
    """The scalar reward spread over `response_ids`: each weighted step reward on the last token of its assistant
    turn, the rest (outcome rewards) on the last policy token. The values sum to `traj.reward`."""
    out = [0.0] * len(traj.response_ids)
    if traj.reward is None or not out:
        return out
    # An empty assistant turn (the policy stopped at once) has no token of its own: use the one before it.
    turn_ends = [min(max(t.end - 1, t.start - 1, 0), len(out) - 1) for t in traj.turns if t.role == "assistant"]
    steps = (traj.step_rewards or [])[: len(turn_ends)]
    for end, r in zip(turn_ends, steps):
        out[end] += r
    policy = [i for i, m in enumerate(traj.loss_mask) if m]
    last = policy[-1] if policy else (turn_ends[-1] if turn_ends else len(out) - 1)
    out[last] += traj.reward - sum(steps)
    return out


class RewardSet:
    """Weighted reward functions that score batches of trajectories (see the module docstring)."""

    def __init__(self, functions: list[RewardFn], *, failure_value: float = 0.0, max_concurrency: int = 64,
                 cache: Any = None):
        self.functions = functions
        self.failure_value = failure_value
        self.max_concurrency = max_concurrency
        self.cache = cache
        """A ToolCache handed to functions that ask for `cache` (LLM judges keep verdicts there)."""

    @classmethod
    def from_config(cls, cfg: RewardsConfig, base_dir: Path | str, *, cache: Any = None,
                    file: str | None = None) -> "RewardSet":
        """Load and validate every function of the `rewards:` section; ALL problems raise as one ConfigError."""
        functions, problems = load_reward_functions(cfg, Path(base_dir))
        if problems:
            head = problems[0] if len(problems) == 1 else f"{len(problems)} problems in rewards:"
            raise ConfigError(head, file=file, problems=problems)
        return cls(functions, failure_value=cfg.failure_value, max_concurrency=cfg.max_concurrency, cache=cache)

    def _arguments(self, fn: RewardFn, traj: Trajectory) -> dict[str, Any]:
        task = traj.task or {}
        supply = {
            "trajectory": lambda: traj, "completion": lambda: traj.completion,
            "final_response": lambda: traj.final_response, "answer": lambda: task.get("answer"),
            "tool_calls": lambda: traj.tool_calls, "task": lambda: task, "messages": lambda: traj.messages,
            "metadata": lambda: task.get("metadata") or {}, "cache": lambda: self.cache,
        }
        return {**{n: supply[n]() for n in fn.wants}, **fn.kwargs}

    async def _call(self, fn: RewardFn, traj: Trajectory, limit: asyncio.Semaphore) -> _Outcome:
        kwargs = self._arguments(fn, traj)
        async with limit:
            if fn.is_async:
                value = await fn.func(**kwargs)
            elif fn.inline:
                value = fn.func(**kwargs)
            else:
                # Off the event loop: a slow sync reward must not stall rollouts or judges in flight.
                value = await asyncio.to_thread(fn.func, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        return _interpret(fn, value, traj)

    async def score(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Score every trajectory in place (reward, reward_components, step_rewards, reward_failed) and return
        metrics: reward/mean, reward/std, reward/<name> (mean over samples it scored), reward/errors."""
        limit = asyncio.Semaphore(self.max_concurrency)
        jobs = [self._call(fn, t, limit) for t in trajectories for fn in self.functions]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        per_name: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        k = 0
        for traj in trajectories:
            total, failed = 0.0, False
            steps: list[float] | None = None
            comps: dict[str, float] = {}
            for fn in self.functions:
                res = results[k]
                k += 1
                if isinstance(res, BaseException):
                    if not isinstance(res, Exception):
                        raise res  # KeyboardInterrupt / cancellation are not reward failures
                    failed = True
                    errors[fn.name] = errors.get(fn.name, 0) + 1
                    logger.warning("reward %s failed on trajectory %s: %s: %s", fn.name, traj.id,
                                   type(res).__name__, res)
                    continue
                comps.update(res.components)
                per_name.setdefault(fn.name, []).append(res.score)
                total += fn.weight * res.score
                if res.steps is not None and fn.weight != 0:
                    steps = [0.0] * len(res.steps) if steps is None else steps
                    steps = [a + fn.weight * b for a, b in zip(steps, res.steps)]
            traj.reward_components = comps
            traj.reward_failed = failed
            traj.reward = self.failure_value if failed else total
            traj.step_rewards = None if failed else steps
        rewards = [t.reward for t in trajectories]
        metrics: dict[str, float] = {
            "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
            "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "reward/errors": float(sum(errors.values())),
        }
        for name, values in per_name.items():
            metrics[f"reward/{name}"] = statistics.fmean(values)
        for name, n in errors.items():
            metrics[f"reward/errors/{name}"] = float(n)
        return metrics

