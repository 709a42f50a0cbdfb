"""verl's own config machinery, as the recipe translation uses it: values written in Hydra's override grammar,
verl's `ppo_trainer` composed with them, and verl's own checks on the result, whose messages are re-raised naming
the recipe fields behind the verl keys they mention (`VERL_TO_RECIPE`). What the overrides say is `config.py`'s."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import warnings as warnings_module
from pathlib import Path
from typing import Any

import verl
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from rlfactory.errors import ConfigError
from rlfactory.recipe.schema import Recipe

logger = logging.getLogger(__name__)

# verl key (prefix) -> the recipe field it comes from, for re-raising verl's own validation messages.
VERL_TO_RECIPE: dict[str, str] = {
    "data.train_batch_size": "trainer.prompts_per_step",
    "train_batch_size": "trainer.prompts_per_step",
    "ppo_mini_batch_size": "algorithm.mini_batches_per_step",
    "ppo_micro_batch_size": "algorithm.micro_batch_size",
    "log_prob_micro_batch_size": "algorithm.micro_batch_size",
    "rollout.n": "rollout.samples_per_prompt",
    "n_gpus": "verl.gpus_per_node / verl.nnodes",
    "minimal possible batch size": "verl.gpus_per_node / verl.nnodes",
    "tensor_model_parallel_size": "verl.tensor_parallel_size",
    "gpu_memory_utilization": "verl.gpu_memory_utilization",
    "max_prompt_length": "rollout.max_context_tokens - rollout.max_response_tokens",
    "prompt_length": "rollout.max_context_tokens - rollout.max_response_tokens",
    "response_length": "rollout.max_response_tokens",
    "loss_agg_mode": "algorithm.loss_agg_mode",
    "kl_loss": "algorithm.kl",
    "clip_ratio": "algorithm.clip_ratio_low / clip_ratio_high / clip_ratio_c",
    "lr": "algorithm.learning_rate",
    "temperature": "rollout.sampling.temperature / trainer.eval_temperature",
    "lora": "model.lora",
    "model.path": "model.path",
}

_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (strings always quoted, so paths and colons are safe)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in value) + "]"
    if isinstance(value, dict):
        for k in value:
            if not _BARE.match(str(k)):
                raise ValueError(f"dict key {k!r} cannot be written as a Hydra override")
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as a Hydra override")


def to_overrides(settings: dict[str, Any]) -> list[str]:
    return [f"{k}={hydra_value(v)}" for k, v in settings.items()]


def verl_config_dir() -> str:
    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def compose(overrides: list[str], *, extra: list[str] | None = None) -> Any:
    """verl's `ppo_trainer` config with our overrides, then the recipe's `verl.extra_overrides` (they win)."""
    try:
        with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
            return hydra_compose("ppo_trainer", overrides=list(overrides) + list(extra or []))
    except (HydraException, OmegaConfBaseException) as e:
        bad = [o for o in (extra or []) if o.split("=", 1)[0].lstrip("+~") in str(e)]
        where = f"verl.extra_overrides {bad}" if bad else "verl.extra_overrides (or the translation)"
        raise ConfigError(f"{where}: verl's config rejected it: {e}") from None


def _recipe_fields_in(message: str) -> list[str]:
    return sorted({field for key, field in VERL_TO_RECIPE.items() if key in message})


def validate(cfg: Any, recipe: Recipe) -> list[str]:
    """verl's own checks on the composed config; raises ConfigError naming the recipe fields behind verl's keys.
    Returns warnings (e.g. the model section not checked because the model folder is absent)."""
    warnings: list[str] = []
    sections = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor),
                ("actor_rollout_ref.rollout", cfg.actor_rollout_ref.rollout), ("algorithm", cfg.algorithm)]
    if Path(os.path.expanduser(str(cfg.actor_rollout_ref.model.path))).is_dir():
        sections.append(("actor_rollout_ref.model", cfg.actor_rollout_ref.model))
    else:
        warnings.append(f"model.path {cfg.actor_rollout_ref.model.path} is not a folder here: verl's model section "
                        f"(tokenizer, HF config) was not checked; it must exist on every node of the cluster")
    what = "validate_config"
    try:
        # verl prints its verdicts and warns that GRPO has no critic: keep the CLI's output to our own messages
        with contextlib.redirect_stdout(io.StringIO()) as said, warnings_module.catch_warnings():
            warnings_module.filterwarnings("ignore", message="Disabled critic")
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                            use_critic=need_critic(cfg))
        logger.debug("verl validate_config: %s", said.getvalue().strip())
        for name, section in sections:
            what = f"the {name} section"
            omega_conf_to_dataclass(section)
    except (AssertionError, ValueError, TypeError, KeyError, AttributeError) as e:
        msg = str(e) or type(e).__name__
        fields = _recipe_fields_in(msg)
        hint = f" (recipe field{'s' if len(fields) > 1 else ''}: {', '.join(fields)})" if fields else ""
        raise ConfigError(f"verl rejected the translated config in {what}: {msg}{hint}",
                          file=recipe.source) from None
    return warnings
