"""The Recipe: one pydantic model for a whole training run, loaded from YAML with `--set a.b=c` overrides.

What is here: the sections owned by training (model, tokenizer, data, algorithm, engine, verl, trainer) and the
assembly of the sections other packages own (`tools` from rlfactory/tools/settings.py, `rollout` from
rlfactory/rollout/config.py, `rewards` from rlfactory/reward.py). Relative paths in a recipe are resolved against the
recipe file's folder; `trainer.output_dir` is resolved against the working directory (where runs usually live).

What is not here: checks that need the file system, the model's config or the reward registry; those live in
`rlfactory/train/validate.py` (`validate_recipe`, re-exported here), so that building a Recipe stays cheap.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from rlfactory.errors import ConfigError
from rlfactory.recipe_files import apply_overrides, load_yaml_mapping
from rlfactory.reward import RewardsConfig
from rlfactory.rollout.config import RolloutConfig
from rlfactory.tools.settings import ToolsConfig
from rlfactory.train.sft import SFTConfig

# Tokenizer names that are not paths (built in by rlfactory/models.py).
BUILTIN_TOKENIZERS = ("qwen3-offline",)
# `model.path` value that is not a path: a randomly initialised tiny Qwen3 (rlfactory/models.py `build_tiny_qwen3`)
# with Qwen3's full vocabulary and the offline Qwen3 tokenizer. For CPU smoke runs of the whole path on the local
# engine (it learns nothing useful); the verl engine rejects it (its workers load a model folder).
TINY_RANDOM_MODEL = "tiny-random"
# Positions of the tiny-random model: room for environment tool schemas (~770 tokens) plus a few turns.
TINY_RANDOM_POSITIONS = 4096


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


# ---------------------------------------------------------------------------------------------------------- model
class LoRAConfig(_Section):
    enabled: bool = False
    """Train a LoRA adapter (peft) instead of all weights: for models too big to fully fine-tune on CPU or one GPU."""
    r: int = Field(16, ge=1)
    """LoRA rank."""
    alpha: int = Field(32, ge=1)
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA branch."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names to adapt (Qwen3's attention and MLP projections by default)."""


class ModelConfig(_Section):
    path: str
    """A local Hugging Face model folder (config.json + weights), relative to the recipe or absolute. rlfactory never
    downloads models: fetch them yourself, then point here (or pass `--set model.path=/data/Qwen3-4B`).
    `tiny-random`: a randomly initialised tiny Qwen3 (Qwen3's vocabulary, 4096 positions, seeded by `trainer.seed`)
    with the offline Qwen3 tokenizer, for CPU smoke runs of the whole path on the local engine; not for verl."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype for training: `auto` = float32 on CPU, bfloat16 on GPU."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Optional LoRA adapter training."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute."""


class TokenizerConfig(_Section):
    path: str | None = None
    """Tokenizer folder (relative to the recipe), `qwen3-offline` (Qwen3's chat template and special tokens without a
    download), or empty to use the model folder's tokenizer."""
    chat_template: str | None = None
    """Optional Jinja chat-template file (relative to the recipe) replacing the tokenizer's own."""


# ----------------------------------------------------------------------------------------------------------- data
class DataConfig(_Section):
    train_file: str
    """Training tasks: a JSONL or parquet file (relative to the recipe), one task per row."""
    val_file: str | None = None
    """Validation tasks for `eval` and `trainer.eval_every_steps` (same format); empty = no evaluation."""
    prompt_field: str = "prompt"
    """Row field holding the user prompt: a string, or a list of chat messages."""
    answer_field: str = "answer"
    """Row field holding the reference answer passed to reward functions as `answer`."""
    id_field: str | None = "id"
    """Row field holding a task id (optional; the row number is used when absent)."""
    metadata_fields: list[str] | None = None
    """Row fields passed to rewards and tools as task metadata; empty = every field of the row."""
    system_prompt_field: str | None = None
    """Optional row field with a per-task system prompt (overrides `rollout.system_prompt`)."""
    max_val_tasks: int | None = Field(None, ge=1)
    """Use at most this many validation tasks (the first ones), to keep evaluation short."""


# ------------------------------------------------------------------------------------------------------ algorithm
class KLConfig(_Section):
    use_reference: bool = False
    """Keep a frozen copy of the starting policy and add `coef * KL(policy || reference)` to the loss."""
    type: Literal["low_var_kl", "k3", "kl", "k1", "abs", "mse", "k2", "k3+", "low_var_kl+"] = "low_var_kl"
    """KL estimator, by verl's names (`low_var_kl` = k3, Schulman 2020, http://joschu.net/blog/kl-approx.html)."""
    coef: float = Field(0.0, ge=0.0)
    """Weight of the KL term (0 = off)."""


class OptimizerConfig(_Section):
    name: Literal["adamw"] = "adamw"
    """Optimizer (AdamW)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    eps: float = Field(1e-8, gt=0.0)
    """AdamW epsilon."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up over this many optimizer steps."""


class AlgorithmConfig(_Section):
    name: Literal["grpo"] = "grpo"
    """Policy-gradient algorithm: GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300)."""
    policy_loss: str = "vanilla"
    """verl policy-loss name (`vanilla` = PPO-clip; also `gspo`, `cispo`, `clip_cov`, ...)."""
    clip_ratio_low: float = Field(0.2, ge=0.0)
    """PPO clip: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = Field(0.2, ge=0.0)
    """PPO clip: the ratio is clipped above at 1 + clip_ratio_high (DAPO's clip-higher uses 0.28)."""
    clip_ratio_c: float = Field(3.0, gt=1.0)
    """Dual-clip bound for negative advantages (https://arxiv.org/abs/1912.09729)."""
    kl: KLConfig = Field(default_factory=KLConfig)
    """Optional KL penalty to a frozen reference policy."""
    loss_agg_mode: Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = "token-mean"
    """How the per-token loss becomes a scalar (verl's `agg_loss` names)."""
    norm_adv_by_std: bool = True
    """Divide group advantages by the group's std (GRPO); false = Dr. GRPO (https://arxiv.org/abs/2503.20783)."""
    learning_rate: float = Field(1e-6, gt=0.0)
    """Peak learning rate."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer settings."""
    grad_clip: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this (empty = no clipping)."""
    micro_batch_size: int = Field(8, ge=1)
    """Trajectories per forward/backward pass; gradients accumulate over a mini-batch."""
    mini_batches_per_step: int = Field(1, ge=1)
    """Optimizer updates per epoch over a step's trajectories (groups are split evenly)."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over a step's trajectories."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0 = off; computed as a metric either way)."""


# --------------------------------------------------------------------------------------------------- engine, verl
class VerlConfig(_Section):
    nnodes: int = Field(1, ge=1)
    """Nodes in the Ray cluster."""
    gpus_per_node: int = Field(8, ge=1)
    """GPUs per node."""
    ray_address: str | None = None
    """Address of an existing Ray cluster (`auto` or host:port); empty = start a local one."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Tensor-parallel size of each vLLM rollout replica."""
    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take for weights and KV cache."""
    rollout_name: Literal["vllm", "sglang"] = "vllm"
    """verl rollout backend."""
    extra_overrides: list[str] = Field(default_factory=list)
    """Extra Hydra overrides passed to verl unchanged, e.g. `actor_rollout_ref.actor.fsdp_config.param_offload=true`."""


# -------------------------------------------------------------------------------------------------------- trainer
class LogConfig(_Section):
    tensorboard: bool = True
    """Write TensorBoard events under `<output_dir>/tensorboard`."""
    transcripts_per_step: int = Field(4, ge=0)
    """Sampled trajectories saved per step for the HTML viewer (0 = none)."""


class TrainerConfig(_Section):
    total_steps: int = Field(100, ge=1)
    """Training steps (each: rollouts for `prompts_per_step` prompts, then the policy update)."""
    prompts_per_step: int = Field(8, ge=1)
    """Prompts sampled per step; each is rolled out `rollout.samples_per_prompt` times."""
    eval_every_steps: int = Field(0, ge=0)
    """Evaluate on `data.val_file` every N steps and at the end (0 = never during training)."""
    eval_samples_per_prompt: int = Field(1, ge=1)
    """k of pass@k in evaluation."""
    eval_temperature: float = Field(0.0, ge=0.0)
    """Sampling temperature in evaluation (0 = greedy; pass@k with k > 1 needs > 0)."""
    eval_success_threshold: float = 1.0
    """A sample counts as solved for pass@k when its reward is at least this."""
    save_every_steps: int = Field(0, ge=0)
    """Checkpoint every N steps and at the end (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Keep the newest N checkpoints; older ones are deleted."""
    output_dir: str = "runs/rlfactory"
    """Run folder (relative to the working directory): metrics, checkpoints, transcripts, plots."""
    seed: int = 0
    """Seed for data order, sampling and initialisation; the same seed gives the same metrics (also across resume)."""
    log: LogConfig = Field(default_factory=LogConfig)
    """What to log besides metrics.jsonl."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the local engine runs: `auto` = the GPU when present."""
    torch_threads: int = Field(1, ge=1)
    """torch CPU threads (1 measured fastest on a 2-core machine running tool servers beside training)."""


# --------------------------------------------------------------------------------------------------------- recipe
class Recipe(_Section):
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
    """Optional supervised warm-up run by `rlfactory sft RECIPE` (see rlfactory/train/sft.py)."""

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _source: str | None = PrivateAttr(default=None)

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> "Recipe":
        """Load a recipe file, apply `a.b=c` overrides, resolve relative paths against the file's folder.

        Raises ConfigError listing every problem (with dotted field paths) when the recipe is invalid."""
        path = Path(path)
        raw = load_yaml_mapping(path)
        raw = apply_overrides(raw, overrides or [], source=str(path))
        return cls.from_dict(raw, base_dir=path.resolve().parent, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, base_dir: str | Path | None = None,
                  source: str | None = None, check_arithmetic: bool = True) -> "Recipe":
        """Build a recipe from a plain mapping (the Python API's path); relative paths resolve against `base_dir`.

        Raises ConfigError with every field problem (or, when the fields are valid, every cross-field problem)."""
        from pydantic import ValidationError

        base = Path(base_dir).resolve() if base_dir is not None else Path.cwd()
        try:
            recipe = cls.model_validate(raw)
        except ValidationError as e:
            problems = format_validation_errors(e, cls)
            raise ConfigError(_summary(problems), file=source, problems=problems) from None
        problems = cross_field_problems(recipe) if check_arithmetic else []
        if problems:
            raise ConfigError(_summary(problems), file=source, problems=problems)
        recipe._base_dir = base
        recipe._source = source
        recipe._resolve_paths()
        return recipe

    def _resolve_paths(self) -> None:
        if self.model.path != TINY_RANDOM_MODEL:
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


# ------------------------------------------------------------------------------------------------------- helpers
def _abs(p: str, base: Path) -> str:
    q = Path(p).expanduser()
    return str(q if q.is_absolute() else (base / q).resolve())


def resolve_model_path(p: str, base: Path) -> str:
    """Resolve a model/tokenizer path against the recipe folder. A string that is not there and looks like a hub id
    (`org/name`) is kept as given: the loader reports it (rlfactory never downloads)."""
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    if (base / q).exists() or p.startswith(".") or p.count("/") != 1:
        return str((base / q).resolve())
    return p


def cross_field_problems(r: "Recipe") -> list[str]:
    """Arithmetic between fields (see rlfactory/train/validate.py)."""
    from rlfactory.train.validate import cross_field_problems as _cross

    return _cross(r)


def _summary(problems: list[str]) -> str:
    return problems[0] if len(problems) == 1 else f"{len(problems)} problems in the recipe:"


def format_validation_errors(e: Any, root: type[BaseModel]) -> list[str]:
    """pydantic errors as `dotted.path: message`, with `did you mean` for unknown keys."""
    from rlfactory.train.validate import describe_error

    return [describe_error(err, root) for err in e.errors(include_url=False)]


def validate_recipe(path: str | Path, overrides: list[str] | None = None) -> list[str]:
    """Every problem of a recipe file at once (fields, arithmetic, files, rewards); empty when it is valid.
    See rlfactory/train/validate.py."""
    from rlfactory.train.validate import validate_recipe as _validate

    return _validate(path, overrides)
