"""What `--resume` does with a recipe that differs from the run's saved one (`<output_dir>/recipe.yaml`).

Every difference is shown, field by field, against the saved recipe. Changes that leave what the run trains on
as it was (how long it runs, how often it saves or logs, the learning rate from here on, speed knobs) are applied
and recorded in `resumes.jsonl` (one line per resume: the step and each change), and `recipe.yaml` is rewritten.
Any other change is refused before any work starts, each with its reason: continuing the saved run under it
would not be that run (another seed draws other data; another model, data or reward trains something else).
Start a new run for those (`--output-dir`, or `--overwrite` to replace this one).
Left out: the verl engine (it resumes from verl's own checkpoints and configuration).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError
from rlfactory.recipe.schema import Recipe

APPLIED: dict[str, str] = {
    "name": "a label",
    "description": "a label",
    "trainer.output_dir": "the run folder, wherever it is now",
    "trainer.total_steps": "the run ends at the new step count",
    "trainer.max_minutes": "the resumed process trains for the new budget",
    "trainer.save_every_steps": "checkpoints follow the new interval",
    "trainer.keep_checkpoints": "pruning keeps the new number",
    "trainer.eval_every_steps": "evaluation follows the new interval",
    "trainer.log.": "logging only",
    "trainer.loggers": "logging only (trackers added on resume get the steps from the resumed one on)",
    "trainer.tracking.": "logging only",
    "trainer.torch_threads": "speed only",
    "model.compute_dtype": "the same weights; matmuls in another precision from the resumed step on",
    "trainer.split_cores": "speed only",
    "algorithm.learning_rate": "the optimizer uses it from the resumed step on (the warm-up schedule continues)",
    "algorithm.micro_batch_size": "the same gradient, computed in other slices",
    "algorithm.shared_prompt_forward": "the same gradient, computed another way",
    "rollout.prefix_cache": "the same rollouts, computed another way",
    "rollout.max_concurrent_trajectories": "speed only",
    "data.max_val_tasks": "evaluation only",
    "data.val_file": "evaluation only",
    "trainer.max_env_outage_s": "outages are waited out for the new time from the resumed step on",
    "trainer.generator_watchdog_s": "logging only",
    "trainer.generator_stall_timeout_s": "a stalled generator is waited for the new time from the resumed step on",
}
"""Fields (or prefixes ending in '.') a resume may change, and what the change means."""

REASONS: dict[str, str] = {
    "trainer.seed": "the remaining steps' prompts and sampling seeds come from the saved run's seed",
    "model.": "the checkpoint holds the saved model's weights",
    "tokenizer.": "the trained tokens are the saved tokenizer's",
    "data.skip_settled_epochs": "the checkpoint's sampler set tasks aside for the saved number of epochs, so the "
                                "remaining draws would not be the saved run's",
    "data.": "the data position in the checkpoint is one of the saved data",
    "rewards.": "the saved steps were scored by the saved rewards",
    "engine": "the checkpoint is the saved engine's",
}
"""Why a refused field cannot change (by field or prefix; the first match wins, so a field comes before its
prefix); others get the general reason below."""
GENERAL_REASON = "it changes what the run trains on, so the resumed steps would not continue the saved run"


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _match(key: str, table: dict[str, str]) -> str | None:
    for field, text in table.items():
        if key == field or (field.endswith(".") and key.startswith(field)):
            return text
    return None


def recipe_changes(saved: Recipe, new: Recipe) -> list[tuple[str, Any, Any]]:
    """(field, saved value, new value) for every field that differs, in field order."""
    a, b = _flat(saved.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def saved_recipe(output_dir: str | Path) -> Recipe | None:
    """The recipe a run folder was started with (None when it has none)."""
    path = Path(output_dir) / "recipe.yaml"
    return Recipe.from_yaml(path) if path.is_file() else None


def check_resume(output_dir: str | Path, recipe: Recipe) -> list[tuple[str, Any, Any]]:
    """The changes a resume of `output_dir` with `recipe` applies; raise RLFactoryError (before any work) listing
    every change it cannot apply, with the reason."""
    saved = saved_recipe(output_dir)
    if saved is None:
        return []
    changes = recipe_changes(saved, recipe)
    refused = [(k, old, new) for k, old, new in changes if _match(k, APPLIED) is None]
    if refused:
        lines = [f"  {k}: {old!r} -> {new!r} ({_match(k, REASONS) or GENERAL_REASON})" for k, old, new in refused]
        raise RLFactoryError(
            f"--resume of {output_dir}: the recipe differs from the run's recipe.yaml in fields a resume cannot "
            f"change; nothing was started:\n" + "\n".join(lines) + "\nResume with the saved values, or start a new "
            "run (another --output-dir, or --overwrite to replace this one).")
    return changes


def record_resume(output_dir: str | Path, step: int, changes: list[tuple[str, Any, Any]], recipe: Recipe) -> None:
    """Append the resume to `resumes.jsonl` and make `recipe.yaml` the recipe now in force."""
    out = Path(output_dir)
    entry = {"step": step, "changes": {k: [old, new] for k, old, new in changes}}
    with open(out / "resumes.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    if changes:
        (out / "recipe.yaml").write_text(recipe.to_yaml())


def describe(changes: list[tuple[str, Any, Any]]) -> str:
    """One line per applied change, for the log."""
    return "; ".join(f"{k}: {old!r} -> {new!r} ({_match(k, APPLIED)})" for k, old, new in changes)
