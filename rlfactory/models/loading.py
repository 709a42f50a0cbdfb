"""Loading the policy and its tokenizer, once for every part of rlfactory (training, evaluation, rollouts, SFT,
serving, reports, verl's agent-loop workers): a Hugging Face model folder, or `model.path: tiny-random`; the
recipe's tokenizer rules (`tokenizer.path`, `qwen3-offline`, the model folder's own) with a chat template always
attached; an optional LoRA adapter (peft). Models that use `sdpa` attention switch to `rlfactory_sdpa` (attention.py:
the same numbers, no copies of the key/value heads on CPU).

Left out: quantisation and sharding (the verl engine owns those at scale); downloads (rlfactory never downloads).
"""
from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

from rlfactory.errors import ConfigError, RLFactoryError
from rlfactory.models.attention import use_gqa_attention
from rlfactory.models.devices import resolve_device, resolve_dtype
from rlfactory.models.precision import resolve_compute_dtype, set_compute_dtype
from rlfactory.models.tiny import build_tiny_qwen3, build_tiny_qwen3_vl
from rlfactory.models.tokenizer import QWEN3_MODEL_VOCAB_SIZE, attach_chat_template, load_qwen_tokenizer
from rlfactory.models.vision import (
    IMAGE_PAD,
    VL_MODEL_TYPES,
    attach_vision,
    load_vision_processor,
    tiny_vision_processor,
    vl_chat_template,
)
from rlfactory.recipe.schema import Recipe
from rlfactory.recipe.training import TINY_RANDOM_MODELS, TINY_RANDOM_POSITIONS, TINY_RANDOM_VL_MODEL

logger = logging.getLogger(__name__)


def load_model(path: str | Path, dtype: Any = "float32", device: Any = None) -> Any:
    """Load a causal LM from an HF model directory (or a hub id when online), in eval mode on `device`."""
    torch_dtype = resolve_dtype(dtype)
    target = resolve_device(device)
    local = Path(path)
    if local.exists() and not (local / "config.json").exists():
        raise RLFactoryError(f"{local} has no config.json: point `model` at an HF model directory")
    auto = AutoModelForImageTextToText if _model_type(local) in VL_MODEL_TYPES else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(str(path), dtype=torch_dtype)
    except OSError as e:
        raise RLFactoryError(
            f"could not load model {path!r}: {e}. Use a local HF model directory, or download it first "
            "(huggingface-cli download NAME) when running offline."
        ) from e
    logger.info("loaded %s (%s) on %s", path, torch_dtype, target)
    return use_gqa_attention(model.to(target).eval())


def _model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def is_tiny_random(recipe: Recipe) -> bool:
    """Whether the recipe's model is a built-in random tiny one (`model.path: tiny-random` or `tiny-random-vl`)."""
    return recipe.model.path in TINY_RANDOM_MODELS


def load_tokenizer(recipe: Recipe, model_path: str | Path | None = None) -> Any:
    """The recipe's tokenizer: `tokenizer.path`, `qwen3-offline`, or the model folder's; with a chat template.
    A `tiny-random` model uses the offline Qwen3 tokenizer (also for its checkpoints, which hold no tokenizer).
    A vision-language policy's tokenizer carries its image processor (`models/vision.py` `vision_of`): the tiny one
    for `tiny-random-vl` (with the project's Qwen3-VL template), else the model folder's."""
    path = recipe.tokenizer.path or ("qwen3-offline" if is_tiny_random(recipe)
                                     else str(model_path or recipe.model.path))
    tok = load_tokenizer_from(path, field="tokenizer.path (or model.path)")
    if recipe.model.path == TINY_RANDOM_VL_MODEL:
        tok = copy.copy(tok)  # the offline tokenizer is shared within a process: the text policies' stays as it is
        tok.chat_template = vl_chat_template()
        attach_vision(tok, tiny_vision_processor(tok))
    elif _model_type(Path(model_path or recipe.model.path)) in VL_MODEL_TYPES:
        attach_vision(tok, load_vision_processor(Path(model_path or recipe.model.path), tok))
        if IMAGE_PAD not in (tok.chat_template or ""):  # the folder's template (or the text one) shows no images
            tok.chat_template = vl_chat_template()
    if recipe.tokenizer.chat_template:
        tok.chat_template = Path(recipe.tokenizer.chat_template).read_text()
    return tok


def load_tokenizer_from(path: str | Path, *, field: str = "the tokenizer") -> Any:
    """A tokenizer folder (never downloaded), or `qwen3-offline`; the Qwen3 chat template is attached when the folder
    has none. `field` names what the user set, for the error message."""
    if str(path) == "qwen3-offline":
        return load_qwen_tokenizer()
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise RLFactoryError(f"{field}: cannot load a tokenizer from {str(path)!r}: {e}. Point it at a folder with "
                             f"tokenizer files, or use qwen3-offline") from None
    if not getattr(tok, "chat_template", None):
        tok = attach_chat_template(tok)
    return tok


def pad_id_of(tokenizer: Any) -> int:
    for cand in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(cand, int):
            return cand
    return 0


def load_policy(recipe: Recipe, device: Any, model_path: str | Path | None = None) -> Any:
    """The policy: the HF model in the recipe's dtype on `device`, wrapped in a LoRA adapter when enabled."""
    dtype = recipe.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if torch.device(device).type == "cuda" else "float32"
    path = str(model_path or recipe.model.path)
    if model_path is None and is_tiny_random(recipe):
        model = build_tiny_random(recipe, dtype, device)
    elif not Path(path).exists():
        raise ConfigError(f"model.path: folder not found: {path} (rlfactory does not download models; pass "
                          f"--set model.path=DIR, or model.path=tiny-random for a CPU smoke run)", file=recipe.source)
    else:
        model = load_model(path, dtype=dtype, device=device)
    set_compute_dtype(model, resolve_compute_dtype(recipe.model.compute_dtype, device))
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = True  # generation (eval mode) still uses the KV cache
    lora = recipe.model.lora
    if lora.enabled:
        from peft import LoraConfig, get_peft_model  # only with LoRA: importing peft costs seconds

        names = {n.split(".")[-1] for n, _ in model.named_modules()}
        missing = [m for m in lora.target_modules if m not in names]
        if missing:
            raise ConfigError(f"model.lora.target_modules: {missing} are not modules of {path}", file=recipe.source)
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
    model.eval()
    return model


def build_tiny_random(recipe: Recipe, dtype: Any, device: Any) -> Any:
    """`model.path: tiny-random`: a random tiny Qwen3 with Qwen3's vocabulary (so the offline Qwen3 tokenizer's ids
    fit) and TINY_RANDOM_POSITIONS positions, seeded by `trainer.seed` (a resumed run then loads its checkpoint);
    `tiny-random-vl`: the same text stack as a tiny Qwen3-VL."""
    build = build_tiny_qwen3_vl if recipe.model.path == TINY_RANDOM_VL_MODEL else build_tiny_qwen3
    model = build(QWEN3_MODEL_VOCAB_SIZE, seed=recipe.trainer.seed, max_position_embeddings=TINY_RANDOM_POSITIONS)
    logger.info("model.path is %s: %s (%.1fM parameters, %d positions)", recipe.model.path, type(model).__name__,
                sum(p.numel() for p in model.parameters()) / 1e6, TINY_RANDOM_POSITIONS)
    return use_gqa_attention(model.to(device=device, dtype=resolve_dtype(dtype)).eval())
