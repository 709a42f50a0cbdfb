"""RewardSet: load reward functions by name / dotted path / file path, weight them, score trajectories.

A reward function is a plain sync or async function that asks for what it needs by parameter name:

    trajectory      the whole `Trajectory`
    completion      the assistant's text over all turns     final_response  the last assistant turn's text
    answer          the task's reference answer (row field) task            the data row
    tool_calls      `trajectory.tool_calls` (ToolCallRecord) messages        the conversation as chat messages
    metadata        the row's `metadata` dict (or {})       cache           the run's ToolCache (LLM judges), or None

plus the spec's `kwargs`. It returns one of
    a float (bool/int accepted)         the function's score;
    a dict of named floats              every entry is logged as `<name>/<key>`; the trained value is its "score"
                                        key (required unless the weight is 0);
    a list with one float per assistant turn (a step / process reward) — its sum is the function's score, and the
                                        weighted per-turn values land in `trajectory.step_rewards`, placed on each
                                        turn's last token by `token_level_rewards`.
The trained reward is the weighted sum; weight 0 = a metric only. A function that raises (or returns something
else) is counted in `reward/errors`, logged with the trajectory id, and its sample gets `failure_value` and
`reward_failed = True`: never a silent 0.

Also here: finding the functions (a registered name, a dotted path `pkg.mod:func`, or `file.py:func` beside the
recipe) with every signature problem reported at once, and pass@k over scored trajectories. The registered names point
at `rlfactory.rewards` (the top-level rewards/ folder), imported only when a recipe names them, so one broken
optional module cannot break the others.

What is left out: reward normalisation and advantages (rlfactory/algorithms/), and the reward functions themselves
(rewards/).
"""
from __future__ import annotations

import asyncio
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rlfactory.errors import ConfigError
from rlfactory.recipe.rewards import RewardsConfig
from rlfactory.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ loading
# Registered names -> "module:function". Imported lazily, so one broken optional module can't break the others.
REGISTRY: dict[str, str] = {
    "exact_match": "rlfactory.rewards.qa:exact_match",
    "f1": "rlfactory.rewards.qa:f1",
    "contains": "rlfactory.rewards.qa:contains",
    "tool_calls_well_formed": "rlfactory.rewards.format:tool_calls_well_formed",
    "answer_tag_present": "rlfactory.rewards.format:answer_tag_present",
    "thinking_well_formed": "rlfactory.rewards.format:thinking_well_formed",
    "failed_tool_call_penalty": "rlfactory.rewards.format:failed_tool_call_penalty",
    "too_many_tool_calls_penalty": "rlfactory.rewards.format:too_many_tool_calls_penalty",
    "tool_use_required": "rlfactory.rewards.format:tool_use_required",
    "tool_success_per_turn": "rlfactory.rewards.format:tool_success_per_turn",
    "llm_judge": "rlfactory.rewards.judge:llm_judge",
    "env_score": "rlfactory.rewards.env:env_score",
    "env_success": "rlfactory.rewards.env:env_success",
    "env_return": "rlfactory.rewards.env:env_return",
    "env_step_rewards": "rlfactory.rewards.env:env_step_rewards",
}

INJECTABLE = ("trajectory", "completion", "final_response", "answer", "tool_calls", "task", "messages", "metadata",
              "cache")
"""Parameter names the RewardSet fills in; anything else must come from the spec's kwargs or have a default."""

_FILE_RE = re.compile(r"^(?P<path>.+\.py):(?P<attr>[A-Za-z_]\w*)$")


@dataclass
class RewardFn:
    """One loaded, validated reward function."""

    name: str
    func: Callable[..., Any]
    weight: float
    kwargs: dict[str, Any]
    wants: tuple[str, ...]
    """The injectable names the function asks for (all of them when it takes **kwargs)."""
    is_async: bool


def _import_attr(module_name: str, attr: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == "rewards" and (module_name == "rewards" or module_name.startswith("rewards.")):
            # The shipped reward modules used to install as a top-level `rewards` package.
            new = f"rlfactory.{module_name}:{attr}"
            registered = f" or the registered name '{attr}'" if attr in REGISTRY else ""
            raise LookupError(f"'{module_name}:{attr}': the shipped reward functions live in rlfactory.rewards now; "
                              f"use '{new}'{registered}") from None
        raise
    if not hasattr(module, attr):
        raise AttributeError(f"module '{module_name}' has no attribute '{attr}'")
    return getattr(module, attr)


def _load_file(path: Path, attr: str) -> Any:
    # A unique module name per file, so two recipes' `rewards.py` don't shadow each other in sys.modules.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"rlfactory_user_rewards_{path.stem}_{digest}"
    if module_name in sys.modules:  # loaded once per process: several specs share the file's module state
        module = sys.modules[module_name]
        if not hasattr(module, attr):
            raise AttributeError(f"{path} defines no '{attr}'")
        return getattr(module, attr)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # a file that failed to import is retried next time, not half-cached
        raise
    if not hasattr(module, attr):
        raise AttributeError(f"{path} defines no '{attr}'")
    return getattr(module, attr)


def resolve_function(ref: str, base_dir: Path) -> Callable[..., Any]:
    """A reward function from a registered name, `pkg.mod:func` / `pkg.mod.func`, or `file.py:func` (relative to
    base_dir). Raises LookupError/ImportError/AttributeError with a message that fits after the field name."""
    ref = ref.strip()
    m = _FILE_RE.match(ref)
    if m:
        path = Path(m["path"]).expanduser()
        path = path if path.is_absolute() else (base_dir / path)
        if not path.is_file():
            raise FileNotFoundError(f"file '{m['path']}' not found (looked for {path.resolve()})")
        return _load_file(path.resolve(), m["attr"])
    if ":" in ref:
        module_name, attr = ref.split(":", 1)
        return _import_attr(module_name, attr)
    if "." in ref:
        module_name, attr = ref.rsplit(".", 1)
        return _import_attr(module_name, attr)
    if ref in REGISTRY:
        return _import_attr(*REGISTRY[ref].split(":"))
    close = difflib.get_close_matches(ref, REGISTRY, n=1)
    if close:
        raise LookupError(f"no reward function '{ref}' (did you mean '{close[0]}'?)")
    raise LookupError(f"no reward function '{ref}'; use a registered name ({', '.join(sorted(REGISTRY))}), a "
                      f"dotted path (pkg.mod:func) or file.py:func relative to the recipe")


def _signature_problems(func: Callable[..., Any], kwargs: dict[str, Any], where: str) -> tuple[list[str], tuple]:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError) as e:
        return [f"{where}.function: cannot read the signature of {func!r}: {e}"], ()
    problems: list[str] = []
    takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    for n, p in named.items():
        if p.kind is p.POSITIONAL_ONLY:
            problems.append(f"{where}.function: parameter '{n}' is positional-only; reward arguments are passed "
                            f"by name")
        elif n not in INJECTABLE and n not in kwargs and p.default is p.empty:
            close = difflib.get_close_matches(n, INJECTABLE, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(f"{where}.function: parameter '{n}' of {getattr(func, '__name__', func)} is not one the "
                            f"reward set supplies{hint} ({', '.join(INJECTABLE)}) and has no value in "
                            f"{where}.kwargs or default")
    for k in kwargs:
        if k in INJECTABLE:
            problems.append(f"{where}.kwargs.{k}: '{k}' is supplied by the reward set; remove it from kwargs")
        elif k not in named and not takes_var_kw:
            close = difflib.get_close_matches(k, list(named), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; it takes: {', '.join(named) or 'nothing'}"
            problems.append(f"{where}.kwargs.{k}: {getattr(func, '__name__', func)} has no parameter '{k}'{hint}")
    wants = INJECTABLE if takes_var_kw else tuple(n for n in named if n in INJECTABLE)
    return problems, wants


def load_reward_functions(cfg: RewardsConfig, base_dir: Path) -> tuple[list[RewardFn], list[str]]:
    """Resolve and validate every spec; returns the loaded functions and EVERY problem found (empty = all good)."""
    loaded: list[RewardFn] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for i, spec in enumerate(cfg.functions):
        where = f"rewards.functions[{i}]"
        if not math.isfinite(spec.weight):
            problems.append(f"{where}.weight: {spec.weight} is not a finite number")
        try:
            func = resolve_function(spec.function, base_dir)
        except Exception as e:  # noqa: BLE001 - any import failure is a config problem to report, with its message
            msg = str(e) if isinstance(e, (LookupError, FileNotFoundError)) else f"{type(e).__name__}: {e}"
            problems.append(f"{where}.function: {msg}")
            continue
        if not callable(func):
            problems.append(f"{where}.function: '{spec.function}' is a {type(func).__name__}, not a function")
            continue
        sig_problems, wants = _signature_problems(func, spec.kwargs, where)
        problems += sig_problems
        name = spec.name or (spec.function if spec.function in REGISTRY else getattr(func, "__name__", "reward"))
        if name in seen:
            problems.append(f"{where}.name: '{name}' is already used by {seen[name]}; set a distinct `name`")
        seen[name] = where
        is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))
        loaded.append(RewardFn(name, func, spec.weight, dict(spec.kwargs), wants, is_async))
    return loaded, problems


# ------------------------------------------------------------------------------------------------ scoring
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


def combine_reward_metrics(per_trajectory: list[dict[str, float]]) -> dict[str, float]:
    """The metrics `RewardSet.score` returns for a batch, from the metrics it returned for each trajectory alone
    (verl's workers score one trajectory at a time): the same keys and the same values."""
    rewards = [m["reward/mean"] for m in per_trajectory]
    out: dict[str, float] = {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/errors": float(sum(m.get("reward/errors", 0.0) for m in per_trajectory)),
    }
    scored: dict[str, list[float]] = {}
    failed: dict[str, float] = {}
    for m in per_trajectory:
        for key, value in m.items():
            if key.startswith("reward/errors/"):
                failed[key] = failed.get(key, 0.0) + value
            elif key not in ("reward/mean", "reward/std", "reward/errors"):
                scored.setdefault(key, []).append(value)
    out.update({key: statistics.fmean(values) for key, values in scored.items()})
    out.update(failed)
    return out


# ------------------------------------------------------------------------------------------------ pass@k
def pass_at_k(trajectories: list[Any], k: int, threshold: float) -> dict[str, float]:
    """pass@1 (mean success rate) and pass@k (a task is solved when any of its k samples is); success means
    reward >= threshold. With exactly k samples per task the unbiased estimator (Chen et al. 2021,
    https://arxiv.org/abs/2107.03374) reduces to `any`."""
    groups: dict[Any, list[bool]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id or t.task_id, []).append((t.reward or 0.0) >= threshold)
    if not groups:
        return {"pass@1": 0.0, f"pass@{k}": 0.0}
    p1 = sum(sum(v) / len(v) for v in groups.values()) / len(groups)
    pk = sum(1.0 for v in groups.values() if any(v)) / len(groups)
    return {"pass@1": p1, f"pass@{k}": pk}
