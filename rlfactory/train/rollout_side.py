"""The rollout side of the local engine: tokenizer, policy model (+ LoRA), tool servers, chat format, HF engine,
AgentLoop and RewardSet, built from a Recipe and torn down together.

The engine generates with the trainer's own model object (no copy): after an optimizer step the next rollout
already uses the new weights. Left out: the training loop (`local.py`), vLLM (the verl engine's job).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from rlfactory.errors import ConfigError, RLFactoryError

logger = logging.getLogger(__name__)


def is_tiny_random(recipe: Any) -> bool:
    """Whether the recipe's model is the built-in random tiny Qwen3 (`model.path: tiny-random`)."""
    from rlfactory.config import TINY_RANDOM_MODEL

    return recipe.model.path == TINY_RANDOM_MODEL


def load_tokenizer(recipe: Any, model_path: str | Path | None = None) -> Any:
    """The recipe's tokenizer: `tokenizer.path`, `qwen3-offline`, or the model folder's; with a chat template.
    A `tiny-random` model uses the offline Qwen3 tokenizer (also for its checkpoints, which hold no tokenizer)."""
    from rlfactory.rollout.tokenizer import attach_chat_template, load_qwen_tokenizer

    path = recipe.tokenizer.path or ("qwen3-offline" if is_tiny_random(recipe)
                                     else str(model_path or recipe.model.path))
    if path == "qwen3-offline":
        tok = load_qwen_tokenizer()
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise RLFactoryError(f"tokenizer: cannot load {path!r}: {e}. Point tokenizer.path (or model.path) at a "
                                 f"folder with tokenizer files, or use tokenizer.path: qwen3-offline") from None
    if recipe.tokenizer.chat_template:
        tok.chat_template = Path(recipe.tokenizer.chat_template).read_text()
    elif not getattr(tok, "chat_template", None):
        tok = attach_chat_template(tok)
    return tok


def pad_id_of(tokenizer: Any) -> int:
    for cand in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(cand, int):
            return cand
    return 0


def load_policy(recipe: Any, device: Any, model_path: str | Path | None = None) -> Any:
    """The policy: the HF model in the recipe's dtype on `device`, wrapped in a LoRA adapter when enabled."""
    import torch

    from rlfactory.models import load_model

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
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = True  # generation (eval mode) still uses the KV cache
    lora = recipe.model.lora
    if lora.enabled:
        from peft import LoraConfig, get_peft_model

        names = {n.split(".")[-1] for n, _ in model.named_modules()}
        missing = [m for m in lora.target_modules if m not in names]
        if missing:
            raise ConfigError(f"model.lora.target_modules: {missing} are not modules of {path}", file=recipe.source)
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
    model.eval()
    return model


def build_tiny_random(recipe: Any, dtype: Any, device: Any) -> Any:
    """`model.path: tiny-random`: a random tiny Qwen3 with Qwen3's vocabulary (so the offline Qwen3 tokenizer's ids
    fit) and TINY_RANDOM_POSITIONS positions, seeded by `trainer.seed` (a resumed run then loads its checkpoint)."""
    from rlfactory.config import TINY_RANDOM_POSITIONS
    from rlfactory.models import build_tiny_qwen3, resolve_dtype
    from rlfactory.rollout.tokenizer import QWEN3_MODEL_VOCAB_SIZE

    model = build_tiny_qwen3(QWEN3_MODEL_VOCAB_SIZE, seed=recipe.trainer.seed,
                             max_position_embeddings=TINY_RANDOM_POSITIONS)
    logger.info("model.path is tiny-random: random tiny Qwen3 (%.1fM parameters, %d positions)",
                sum(p.numel() for p in model.parameters()) / 1e6, TINY_RANDOM_POSITIONS)
    return model.to(device=device, dtype=resolve_dtype(dtype)).eval()


@dataclass
class RolloutSide:
    """Everything a training step needs to produce scored trajectories."""

    tokenizer: Any
    chat: Any
    engine: Any
    tools: Any | None
    loop: Any
    rewards: Any
    cache: Any | None


async def start_tool_side(recipe: Any, tokenizer: Any, run_dir: str | Path) -> tuple[Any, Any, Any, Any]:
    """The recipe's tool cache and started ToolManager (both None without `tools.mcp_configs`), RewardSet and
    ChatFormat: built the same way for the local engine and for verl's agent-loop workers. The embedded cache's file
    lives in `run_dir`. On failure, whatever was started is stopped again; else the caller stops it
    (`close_tool_side`)."""
    from rlfactory.reward import RewardSet
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.tools.cache import make_cache
    from rlfactory.tools.manager import ToolManager

    cache = tools = None
    try:
        if recipe.tools.mcp_configs:
            cache = make_cache(recipe.tools.cache, Path(run_dir) / "tool_cache.rdb")
            tools = ToolManager.from_files(recipe.tools.mcp_configs, cache=cache)
            await tools.start()
        rewards = RewardSet.from_config(recipe.rewards, recipe.base_dir, cache=cache, file=recipe.source)
        chat = ChatFormat(tokenizer, tools.openai_schemas() if tools else None,
                          enable_thinking=recipe.rollout.enable_thinking, system_prompt=recipe.rollout.system_prompt)
    except BaseException:
        await close_tool_side(tools, cache)
        raise
    return cache, tools, rewards, chat


async def close_tool_side(tools: Any | None, cache: Any | None) -> None:
    """Stop the tool servers, then the cache (the ToolManager leaves the cache, an embedded redis-server, to its
    owner). Closing the cache is best effort."""
    if tools is not None:
        await tools.close()
    if cache is not None:
        with contextlib.suppress(Exception):
            await cache.close()


@contextlib.asynccontextmanager
async def open_rollout_side(recipe: Any, model: Any, tokenizer: Any, device: Any,
                            run_dir: str | Path) -> AsyncIterator[RolloutSide]:
    """Start the tool servers and the engine; stop both on exit (also on errors and Ctrl-C)."""
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.hf_engine import HFEngine

    cache = tools = engine = None
    try:
        cache, tools, rewards, chat = await start_tool_side(recipe, tokenizer, run_dir)
        engine = HFEngine(model, pad_token_id=pad_id_of(tokenizer), eos_token_ids=chat.stop_token_ids,
                          max_batch_size=max(1, min(recipe.rollout.max_concurrent_trajectories, 256)),
                          device=device, tokenizer=tokenizer)
        loop = AgentLoop(engine, tools, chat, recipe.rollout)
        yield RolloutSide(tokenizer, chat, engine, tools, loop, rewards, cache)
    finally:
        if engine is not None:
            await engine.close()
        await close_tool_side(tools, cache)
