"""The Recipe: one pydantic model for a whole training run, loaded from YAML with `--set a.b=c` overrides.

It assembles the sections (`training.py`: model, tokenizer, data, algorithm, verl, trainer; `tools.py`,
`rollout.py`, `rewards.py`, `sft.py`), checks every field and the arithmetic between them, and resolves relative
paths against the recipe file's folder; `trainer.output_dir` is resolved against the working directory (where runs
usually live).

What is not here: checks that need the world outside the recipe (model folders, data rows, mcpServers files, reward
functions); `rlfactory/preflight/` runs those, so that building a Recipe stays cheap.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError

from rlfactory.errors import ConfigError
from rlfactory.recipe.files import apply_overrides, load_yaml_mapping
from rlfactory.recipe.messages import format_validation_errors, summary_line
from rlfactory.recipe.rewards import RewardsConfig
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.recipe.section import Section
from rlfactory.recipe.sft import SFTConfig
from rlfactory.recipe.tools import ToolsConfig
from rlfactory.recipe.training import (
    BUILTIN_TOKENIZERS,
    TINY_RANDOM_MODELS,
    TINY_RANDOM_VL_MODEL,
    AlgorithmConfig,
    DataConfig,
    ModelConfig,
    TokenizerConfig,
    TrainerConfig,
    VerlConfig,
)


class Recipe(Section):
    """A whole training run: what to train, on which tasks, with which tools and rewards, and how."""

    name: str = "run"
    """Short run name (shown in logs and the summary)."""
    description: str = ""
    """Free text: what the recipe does and the hardware it expects."""
    model: ModelConfig
    """The policy model."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """Tokenizer and chat template (thinking on/off lives in `rollout.enable_thinking`)."""
    data: DataConfig
    """Task files and how their fields map to prompts and answers."""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """MCP servers the policy may call, and the result cache."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """How trajectories are generated: group size, sampling, budgets, horizon schedule."""
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    """Reward functions and their weights."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """GRPO settings."""
    engine: Literal["local", "verl"] = "local"
    """`local` (one process, CPU or one GPU) or `verl` (Ray, FSDP and vLLM over many GPUs)."""
    verl: VerlConfig = Field(default_factory=VerlConfig)
    """Cluster settings for `engine: verl`."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Steps, intervals, output folder, seed, logging, device."""
    sft: SFTConfig | None = None
    """Optional supervised warm-up run by `rlfactory sft RECIPE` (see rlfactory/warmup/)."""
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _source: str | None = PrivateAttr(default=None)

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None, *,
                  base_dir: str | Path | None = None) -> "Recipe":
        """Load a recipe file, apply `a.b=c` overrides, resolve relative paths against the file's folder (or
        `base_dir`: a resolved copy of a recipe, such as the one a verl run folder holds, keeps its original folder
        for reward files).

        Raises ConfigError listing every problem (with dotted field paths) when the recipe is invalid."""
        path = Path(path)
        raw = load_yaml_mapping(path)
        raw = apply_overrides(raw, overrides or [], source=str(path))
        base = Path(base_dir) if base_dir is not None else path.resolve().parent
        return cls.from_dict(raw, base_dir=base, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, base_dir: str | Path | None = None,
                  source: str | None = None, check_arithmetic: bool = True) -> "Recipe":
        """Build a recipe from a plain mapping (the Python API's path); relative paths resolve against `base_dir`.

        Raises ConfigError with every field problem (or, when the fields are valid, every cross-field problem)."""
        base = Path(base_dir).resolve() if base_dir is not None else Path.cwd()
        try:
            recipe = cls.model_validate(raw)
        except ValidationError as e:
            problems = format_validation_errors(e, cls)
            raise ConfigError(summary_line(problems), file=source, problems=problems) from None
        problems = cross_field_problems(recipe) if check_arithmetic else []
        if problems:
            raise ConfigError(summary_line(problems), file=source, problems=problems)
        recipe._base_dir = base
        recipe._source = source
        recipe._resolve_paths()
        return recipe

    def _resolve_paths(self) -> None:
        if self.model.path not in TINY_RANDOM_MODELS:
            self.model.path = resolve_model_path(self.model.path, self._base_dir)
        if self.tokenizer.path and self.tokenizer.path not in BUILTIN_TOKENIZERS:
            self.tokenizer.path = resolve_model_path(self.tokenizer.path, self._base_dir)
        if self.tokenizer.chat_template:
            self.tokenizer.chat_template = _abs(self.tokenizer.chat_template, self._base_dir)
        self.data.train_file = _abs(self.data.train_file, self._base_dir)
        if self.data.val_file:
            self.data.val_file = _abs(self.data.val_file, self._base_dir)
        self.tools.mcp_configs = [_abs(p, self._base_dir) for p in self.tools.mcp_configs]
        if self.tools.cache.path:
            self.tools.cache.path = _abs(self.tools.cache.path, self._base_dir)

    @property
    def base_dir(self) -> Path:
        """Folder relative paths were resolved against (the recipe file's folder); reward file paths use it too."""
        return self._base_dir

    @property
    def source(self) -> str | None:
        """The recipe file this was loaded from, if any."""
        return self._source

    def with_overrides(self, overrides: list[str]) -> "Recipe":
        """A copy with `a.b=c` overrides applied (paths already resolved stay resolved)."""
        raw = apply_overrides(self.model_dump(mode="json"), overrides, source=self._source or "recipe")
        return Recipe.from_dict(raw, base_dir=self._base_dir, source=self._source)

    def to_yaml(self) -> str:
        """The fully resolved recipe as YAML (saved into each run folder)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


PACKAGE_PATH_PREFIX = "pkg://"
"""`pkg://PACKAGE/path/in/it`: a file shipped inside an installed package, e.g.
`pkg://rlfactory.envs.tools/data/tasks/textcraft_train.jsonl`, so a recipe finds the environments' task rows from a
checkout, an installed wheel or a folder made by `rlfactory init` alike."""


def _abs(p: str, base: Path) -> str:
    if p.startswith(PACKAGE_PATH_PREFIX):
        return str(package_path(p))
    q = Path(p).expanduser()
    return str(q if q.is_absolute() else (base / q).resolve())


def package_path(ref: str) -> Path:
    """The file a `pkg://PACKAGE/rest` reference names (see PACKAGE_PATH_PREFIX)."""
    package, _, rest = ref[len(PACKAGE_PATH_PREFIX):].partition("/")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"{ref}: no installed package {package!r} (a pkg:// path is pkg://PACKAGE/path/in/it)")
    return Path(next(iter(spec.submodule_search_locations))) / rest


def resolve_model_path(p: str, base: Path) -> str:
    """Resolve a model/tokenizer path against the recipe folder. A string that is not there and looks like a hub id
    (`org/name`) is kept as given: the loader reports it (rlfactory never downloads)."""
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    if (base / q).exists() or p.startswith(".") or p.count("/") != 1:
        return str((base / q).resolve())
    return p


def vl_engine_problems(r: Recipe, model: str) -> list[str]:
    """Why a vision-language policy (`model`) cannot run on this recipe's engines, whatever is installed: images go
    through the local engine only (HF rollouts, rlfactory/rollout/engines/hf_vision.py, or vLLM rollouts where vLLM can
    load the model: preflight checks that, `rollout/engines/vllm_vision.py`); rlfactory does not pass them to verl."""
    p = []
    if r.engine == "verl":
        p.append(f"engine: verl with a vision-language policy ({model}): rlfactory does not map images onto verl's "
                 f"multimodal agent loop yet; use engine: local with rollout.engine: hf")
    return p


def cross_field_problems(r: Recipe) -> list[str]:
    """Arithmetic between fields: batch sizes that don't divide, budgets larger than the context, horizons larger
    than the budgets, reward weights all zero, KL settings that contradict each other."""
    p: list[str] = []
    a, t, ro = r.algorithm, r.trainer, r.rollout
    samples = t.prompts_per_step * ro.samples_per_prompt
    if t.prompts_per_step % a.mini_batches_per_step:
        p.append(f"algorithm.mini_batches_per_step ({a.mini_batches_per_step}) must divide trainer.prompts_per_step "
                 f"({t.prompts_per_step}): GRPO groups are not split across mini-batches")
    else:
        mini = samples // a.mini_batches_per_step
        # A micro-batch larger than the mini-batch is simply the whole mini-batch.
        if a.micro_batch_size < mini and mini % a.micro_batch_size:
            p.append(f"algorithm.micro_batch_size ({a.micro_batch_size}) must divide the mini-batch of {mini} "
                     f"trajectories (trainer.prompts_per_step {t.prompts_per_step} x rollout.samples_per_prompt "
                     f"{ro.samples_per_prompt} / algorithm.mini_batches_per_step {a.mini_batches_per_step})")
    if r.model.path == TINY_RANDOM_VL_MODEL:
        p.extend(vl_engine_problems(r, r.model.path))
    if ro.max_response_tokens >= ro.max_context_tokens:
        p.append(f"rollout.max_response_tokens ({ro.max_response_tokens}) must be smaller than "
                 f"rollout.max_context_tokens ({ro.max_context_tokens}): the prompt needs room too")
    if ro.sampling.max_new_tokens_per_turn > ro.max_response_tokens:
        p.append(f"rollout.sampling.max_new_tokens_per_turn ({ro.sampling.max_new_tokens_per_turn}) is larger than "
                 f"rollout.max_response_tokens ({ro.max_response_tokens})")
    if ro.tool_response_max_tokens > ro.max_response_tokens:
        p.append(f"rollout.tool_response_max_tokens ({ro.tool_response_max_tokens}) is larger than "
                 f"rollout.max_response_tokens ({ro.max_response_tokens})")
    horizon = getattr(ro.horizon, "turns", None) or max(getattr(ro.horizon, "horizons", [1]))
    # Each assistant turn takes at least one token and each tool turn more: a horizon past the budget can't be used.
    if horizon * 2 > ro.max_response_tokens:
        p.append(f"rollout.horizon allows {horizon} turns but rollout.max_response_tokens ({ro.max_response_tokens}) "
                 f"cannot hold that many turns; raise the budget or lower the horizon")
    if r.rewards.functions and all(f.weight == 0 for f in r.rewards.functions):
        p.append("rewards.functions: every weight is 0, so nothing is trained; give at least one a non-zero weight")
    if a.kl.coef > 0 and not a.kl.use_reference:
        p.append(f"algorithm.kl.coef is {a.kl.coef} but algorithm.kl.use_reference is false: set use_reference: true "
                 f"or coef: 0")
    if r.engine == "verl" and t.max_minutes is not None:
        p.append("trainer.max_minutes: engine verl runs verl's own training loop, which takes no wall-clock budget; "
                 "use trainer.total_steps")
    if r.engine == "verl" and t.max_staleness_steps > 1:
        p.append(f"trainer.max_staleness_steps is {t.max_staleness_steps}: engine verl trains at most one step off "
                 f"policy (verl's colocate_async trainer); use 0 or 1")
    if r.data.skip_settled_epochs and (r.engine == "verl" or t.max_staleness_steps >= 1):
        where = "engine verl" if r.engine == "verl" else f"trainer.max_staleness_steps {t.max_staleness_steps}"
        p.append(f"data.skip_settled_epochs is {r.data.skip_settled_epochs} with {where}: only the local engine's "
                 f"synchronous loop sets tasks aside (the others draw tasks ahead of their results); use 0 there, or "
                 f"engine: local with trainer.max_staleness_steps: 0")
    if r.engine == "verl" and a.negative_advantage_scale != 1.0:
        p.append(f"algorithm.negative_advantage_scale is {a.negative_advantage_scale}: engine verl trains on its own "
                 f"GRPO advantages, unscaled; use engine: local or negative_advantage_scale: 1.0")
    if r.engine == "verl" and a.turn_credit.estimator != "none":
        p.append(f"algorithm.turn_credit.estimator is {a.turn_credit.estimator!r}: engine verl computes one advantage "
                 f"per trajectory (its own GRPO estimator) and cannot take per-turn advantages yet; use engine: local "
                 f"or estimator: none")
    br = ro.branching
    if br.width > 1:
        try:
            br.roots(ro.samples_per_prompt, of=f"rollout.samples_per_prompt ({ro.samples_per_prompt})")
        except ValueError as e:
            p.append(str(e))
        if r.engine == "verl":
            p.append("rollout.branching: engine verl samples each trajectory on its own and cannot grow a group as a "
                     "tree; use engine: local or rollout.branching.width: 1")
        if br.at_turn >= horizon:
            p.append(f"rollout.branching.at_turn ({br.at_turn}) must be below the horizon ({horizon} turns): the "
                     f"roots would end before they branch")
    if t.eval_samples_per_prompt > 1 and t.eval_temperature == 0:
        p.append(f"trainer.eval_samples_per_prompt is {t.eval_samples_per_prompt} with trainer.eval_temperature 0: "
                 f"greedy samples are identical; set eval_temperature > 0 or eval_samples_per_prompt: 1")
    return p
