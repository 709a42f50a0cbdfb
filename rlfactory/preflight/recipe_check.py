"""A recipe checked whole: every problem at once, each message naming the file and the dotted field.

Pydantic field errors (with `did you mean` for typos; an invalid field is dropped so that the rest is checked too),
cross-field arithmetic (`config.cross_field_problems`), then the checks against the world: the model folder
(model_checks.py), the data files (data_files.py), the tool servers and the cache (services.py), the reward
functions, trackers' packages and LoRA's. Loads no model weights and starts no tool server.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlfactory.errors import ConfigError
from rlfactory.preflight.data_files import check_data
from rlfactory.preflight.model_checks import check_local_vllm, check_model
from rlfactory.preflight.services import check_tools
from rlfactory.recipe.files import apply_overrides, load_yaml_mapping
from rlfactory.recipe.messages import describe_error
from rlfactory.recipe.schema import Recipe, cross_field_problems
from rlfactory.report.trackers import missing_packages
from rlfactory.reward import load_reward_functions


@dataclass
class RecipeCheck:
    """The outcome of checking a recipe: the Recipe (when its fields are valid), errors and warnings."""
    recipe: Recipe | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def check_recipe(path: str | Path, overrides: list[str] | None = None, *, for_training: bool = False) -> RecipeCheck:
    """Load and check a recipe file; never raises for user errors (they land in `errors`).

    When some fields are invalid, they are dropped and the rest is checked too, so one run reports every problem."""
    shown = str(path)
    try:
        raw = apply_overrides(load_yaml_mapping(Path(path)), overrides or [], source=shown)
    except ConfigError as e:
        return RecipeCheck(None, [f"{shown}: {p}" if not p.startswith(shown) else p for p in e.problems])
    base = Path(path).resolve().parent
    field_errors: list[str] = []
    for _ in range(3):  # each pass drops the invalid fields; defaults stand in for them
        try:
            Recipe.model_validate(raw)
            break
        except ValidationError as e:
            errs = e.errors(include_url=False)
            field_errors += [describe_error(err, Recipe) for err in errs]
            if not _drop_locations(raw, [err.get("loc", ()) for err in errs]):
                return RecipeCheck(None, [f"{shown}: {m}" for m in _unique(field_errors)])
    try:
        recipe = Recipe.from_dict(raw, base_dir=base, source=shown, check_arithmetic=False)
    except ConfigError as e:
        return RecipeCheck(None, [f"{shown}: {m}" for m in _unique(field_errors + e.problems)])
    field_errors += cross_field_problems(recipe)
    check = check_loaded_recipe(recipe, for_training=for_training, shown=shown)
    check.errors = [f"{shown}: {m}" for m in _unique(field_errors)] + check.errors
    if field_errors:
        check.recipe = None
    return check


def _drop_locations(raw: dict[str, Any], locs: list[tuple]) -> bool:
    """Delete each erroneous location from `raw`; for a missing key, delete its nearest existing parent (so the
    section's defaults stand in). False if nothing could be dropped (e.g. a required top-level section is missing)."""
    changed = False
    for loc in locs:
        node: Any = raw
        deepest: tuple[Any, Any] | None = None  # (container, key) of the deepest location present in the data
        for part in loc:
            if isinstance(node, dict) and part in node:
                deepest = (node, part)
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                deepest = (node, part)
                node = node[part]
            # anything else is a union tag (`horizon.fixed`) or a missing key: skip it
        if deepest is None:
            continue
        container, key = deepest
        if isinstance(container, dict):
            del container[key]
        else:
            container.pop(key)
        changed = True
    return changed


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def check_loaded_recipe(recipe: Recipe, *, for_training: bool = False, shown: str | None = None) -> RecipeCheck:
    """File, model and reward checks on a Recipe that already passed its field checks."""
    shown = shown or recipe.source or "recipe"
    errors: list[str] = []
    warnings: list[str] = []
    check_model(recipe, for_training, errors, warnings)
    check_data(recipe, errors, warnings)
    check_tools(recipe, errors)
    _check_rewards(recipe, errors, required=for_training or recipe.sft is None)
    errors.extend(missing_packages(recipe.trainer.loggers or []))
    if recipe.model.lora.enabled:
        if importlib.util.find_spec("peft") is None:
            errors.append("model.lora.enabled: the `peft` package is not installed (pip install peft)")
    check_local_vllm(recipe, errors)
    return RecipeCheck(recipe, [f"{shown}: {m}" for m in errors], [f"{shown}: {m}" for m in warnings])


def validate_recipe(path: str | Path, overrides: list[str] | None = None) -> list[str]:
    """Every error of a recipe file as `file: dotted.field: message`; empty when it is valid (warnings excluded)."""
    return check_recipe(path, overrides).errors


def _check_rewards(r: Recipe, errors: list[str], *, required: bool) -> None:
    """`required`: GRPO needs a reward; a recipe with only an `sft:` warm-up does not."""
    if not r.rewards.functions:
        if not required:
            return
        errors.append("rewards.functions: empty; add at least one reward function, e.g. "
                      "`- {function: exact_match, weight: 1.0}`")
        return
    try:
        _functions, problems = load_reward_functions(r.rewards, r.base_dir)
        errors.extend(f"rewards.{m}" if not m.startswith("rewards") else m for m in problems)
    except Exception as e:  # a reward module that fails to import is the user's code: report, don't crash
        errors.append(f"rewards.functions: loading failed: {type(e).__name__}: {e}")
