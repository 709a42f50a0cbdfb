"""The Python API: the same runs as the CLI, for notebooks and scripts.

```python
from rlfactory import RLFactory, Recipe, train

RLFactory(tools="mcp_configs/default.json", servers=["calculator"], reward_function=my_reward,
          model="checkpoints/quickstart", train_file="data/train.jsonl", **{"trainer.total_steps": 20}).train()
train(Recipe.from_yaml("recipes/quickstart.yaml", ["trainer.seed=1"]))
```

`RLFactory` builds a Recipe from keyword arguments (optionally on top of a recipe file) and runs it through
`train()`, which is what `rlfactory train` calls: one code path. Left out: anything the CLI cannot also do.
"""
from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from rlfactory.errors import ConfigError
from rlfactory.preflight import check_loaded_recipe
from rlfactory.recipe.files import apply_overrides, load_yaml_mapping
from rlfactory.recipe.schema import Recipe
from rlfactory.report.run_folder import clear_run_outputs, lock_run_folder, refuse_to_replace, remove_partial_saves
from rlfactory.trainer.asynchronous.launch import GeneratorLaunch
from rlfactory.trainer.asynchronous.messages import HelperSpec
from rlfactory.trainer.resume_changes import check_resume

logger = logging.getLogger(__name__)

SHARED_UPDATE_HELPER = "rlfactory.trainer.asynchronous.shared_update:generator_side"
"""The generator's side of `trainer.update_on_generator` (asynchronous/shared_update.py), named for its spec."""

_SHORTCUTS = {
    "model": "model.path",
    "tokenizer": "tokenizer.path",
    "servers": "tools.servers",
    "train_file": "data.train_file",
    "val_file": "data.val_file",
    "output_dir": "trainer.output_dir",
    "total_steps": "trainer.total_steps",
    "prompts_per_step": "trainer.prompts_per_step",
    "samples_per_prompt": "rollout.samples_per_prompt",
    "learning_rate": "algorithm.learning_rate",
    "seed": "trainer.seed",
    "engine": "engine",
}


def _check_or_raise(recipe: Recipe, *, for_training: bool) -> None:
    check = check_loaded_recipe(recipe, for_training=for_training)
    if not check.ok:
        head = check.errors[0] if len(check.errors) == 1 else f"{len(check.errors)} problems in the recipe:"
        raise ConfigError(head, problems=check.errors)


def train(recipe: Recipe, *, resume: bool = False, progress: bool = False, dry_run: bool = False,
          overwrite: bool = False) -> dict[str, Any]:
    """Train with the recipe's engine; returns the run summary (reward first-5 / last-5 / rise, steps, wall_s, ...).

    Validates first (every problem at once, as a ConfigError) and starts nothing when the recipe is invalid, when
    another live run holds `trainer.output_dir` (RunFolderBusy, naming it), or when the folder already holds a run
    and neither `resume` nor `overwrite` is set. The folder stays locked to this run until it returns."""
    # Before the lock, which creates the folder. As in the CLI, verl's model folder need only exist on the cluster.
    _check_or_raise(recipe, for_training=not (recipe.engine == "verl" or dry_run))
    if dry_run:
        return _train(recipe, resume=resume, progress=progress, dry_run=True)
    with lock_run_folder(recipe.trainer.output_dir):
        refuse_to_replace(recipe.trainer.output_dir, resume=resume, overwrite=overwrite)
        if resume and recipe.engine != "verl" and any((Path(recipe.trainer.output_dir) / "checkpoints").glob("step_*")):
            check_resume(recipe.trainer.output_dir, recipe)  # a change a resume cannot apply starts nothing
        return _train(recipe, resume=resume, progress=progress, dry_run=False)


def _train(recipe: Recipe, *, resume: bool, progress: bool, dry_run: bool) -> dict[str, Any]:
    # The engines are imported here, not at the top: an asynchronous run starts its generator process first, so
    # that the two processes import torch and load the model in parallel.
    if recipe.engine == "verl" or dry_run:
        from rlfactory.verl.launch import run_verl

        return run_verl(recipe, dry_run=dry_run, resume=resume)
    if resume:
        resume = _resumable(Path(recipe.trainer.output_dir))
    if recipe.trainer.max_staleness_steps == 0:
        from rlfactory.trainer.loop import train_local

        return train_local(recipe, resume=resume, progress=progress)
    # the generator's side of the shared update is named by a string: its module imports torch, which this process
    # loads only once the generator is spawned (both start up in parallel)
    helper = HelperSpec(SHARED_UPDATE_HELPER) if recipe.trainer.update_on_generator else None
    launch = GeneratorLaunch.start(recipe, helper=helper)
    try:
        from rlfactory.trainer.asynchronous.loop import train_async
        from rlfactory.trainer.asynchronous.shared_update import SharedUpdate, applies
    except BaseException:
        launch.stop()
        raise
    share = SharedUpdate() if helper is not None and applies(recipe) else None
    return train_async(recipe, resume=resume, progress=progress, launch=launch, share=share)


def _resumable(out: Path) -> bool:
    """Before a local `--resume` (the folder's lock held): clear what unfinished saves left, and say what happens
    when there is no checkpoint to continue from. False: the run starts from step 0."""
    remove_partial_saves(out)
    if any((out / "checkpoints").glob("step_*")):
        return True
    cleared = clear_run_outputs(out)
    if cleared:
        logger.warning("--resume: %s has no checkpoint yet (the run stopped before its first save), so the run "
                       "starts again from step 0; what it wrote before is replaced (%s)", out, ", ".join(cleared))
    else:
        logger.info("--resume: %s has no run yet; starting from step 0", out)
    return False


def evaluate(recipe: Recipe, *, checkpoint: str | Path | None = None,
             output_dir: str | Path | None = None) -> dict[str, Any]:
    """Mean reward and pass@k on `data.val_file` (transcripts saved under `<output_dir>/eval`)."""
    _check_or_raise(recipe, for_training=checkpoint is None)
    if not recipe.data.val_file:
        raise ConfigError("data.val_file is empty: evaluation needs a validation file")

    from rlfactory.trainer.evaluate import evaluate_local  # here: see train()

    return evaluate_local(recipe, checkpoint=checkpoint, output_dir=output_dir)


def _function_ref(fn: Callable[..., Any]) -> str:
    """A reference RewardSet can load: `pkg.mod:func` when importable, else `path/to/file.py:func`."""
    module = inspect.getmodule(fn)
    name = fn.__name__
    if name == "<lambda>" or "<locals>" in getattr(fn, "__qualname__", ""):
        raise ConfigError("reward_function must be a module-level function (not a lambda or a nested function), "
                          "so the trainer (and verl's workers) can import it by name")
    if module is None:
        raise ConfigError(f"reward_function {name}: cannot tell which module defines it")
    mod_name = module.__name__
    if mod_name != "__main__" and importlib.util.find_spec(mod_name) is not None:
        return f"{mod_name}:{name}"
    file = getattr(module, "__file__", None) or getattr(sys.modules.get("__main__"), "__file__", None)
    if not file:
        raise ConfigError(f"reward_function {name} is defined in an interactive session; put it in a .py file and "
                          f"import it from there")
    return f"{Path(file).resolve()}:{name}"


class RLFactory:
    """Build a recipe from keyword arguments and run it: `RLFactory(tools=..., reward_function=fn, model=...)`.

    `recipe=` starts from a YAML file; `tools` is one or more mcpServers JSON files; `reward_function` is a function
    (or a list of them, or `(function, weight)` pairs); shortcuts (`model`, `servers`, `train_file`, `val_file`,
    `output_dir`, `total_steps`, `prompts_per_step`, `samples_per_prompt`, `learning_rate`, `seed`, `engine`) and
    dotted keys (`**{"rollout.sampling.temperature": 0.8}`) set any other field. Relative paths resolve against the
    recipe's folder, or the working directory without a recipe."""

    def __init__(self, *, recipe: str | Path | None = None, tools: str | list[str] | None = None,
                 reward_function: Any = None, **overrides: Any):
        raw: dict[str, Any] = load_yaml_mapping(Path(recipe)) if recipe is not None else {}
        base = Path(recipe).resolve().parent if recipe is not None else Path.cwd()
        sets: list[str] = []
        if tools is not None:
            files = [tools] if isinstance(tools, (str, Path)) else list(tools)
            raw.setdefault("tools", {})["mcp_configs"] = [str(f) for f in files]
        if reward_function is not None:
            fns = reward_function if isinstance(reward_function, list) else [reward_function]
            specs = []
            for item in fns:
                fn, weight = item if isinstance(item, tuple) else (item, 1.0)
                ref = fn if isinstance(fn, str) else _function_ref(fn)
                specs.append({"function": ref, "weight": weight})
            raw.setdefault("rewards", {})["functions"] = specs
        for key, value in overrides.items():
            dotted = _SHORTCUTS.get(key, key)
            sets.append(f"{dotted}={_yaml_scalar(value)}")
        raw = apply_overrides(raw, sets, source=str(recipe or "RLFactory(...)"))
        self.recipe = Recipe.from_dict(raw, base_dir=base, source=str(recipe) if recipe else "RLFactory(...)")

    def train(self, *, resume: bool = False, progress: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Run training; returns the summary dict (also written to `<output_dir>/summary.json`)."""
        return train(self.recipe, resume=resume, progress=progress, overwrite=overwrite)

    def evaluate(self, checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Mean reward and pass@k on the validation set."""
        return evaluate(self.recipe, checkpoint=checkpoint)


def _yaml_scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text[:-4].strip() if text.endswith("\n...") or text.endswith(" ...") else text.removesuffix("...")


__all__ = ["RLFactory", "Recipe", "train", "evaluate"]
