"""Reward functions found by name: a registered name (`REGISTRY`, the top-level rewards/ folder, imported only when
a recipe names it), a dotted path `pkg.mod:func`, or `file.py:func` beside the recipe; every signature problem of a
`rewards:` section is reported at once (`load_reward_functions`)."""
from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlfactory.recipe.rewards import RewardsConfig

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
    "env_progress": "rlfactory.rewards.env:env_progress",
}

INLINE = frozenset(REGISTRY) - {"llm_judge"}
"""Registered functions that run on the event loop itself: each is a few string or list operations on one
trajectory, far cheaper than the hop to a worker thread that a function of unknown cost takes (in an asynchronous
quickstart run, those hops were a fifth of the generator's event-loop time)."""

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
    inline: bool = False
    """A cheap synchronous function (`INLINE`): called directly rather than in a worker thread."""


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
        loaded.append(RewardFn(name, func, spec.weight, dict(spec.kwargs), wants, is_async,
                               inline=spec.function in INLINE and not is_async))
    return loaded, problems


