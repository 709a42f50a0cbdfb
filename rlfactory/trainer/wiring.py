"""The rollout side of the local engine: tokenizer, policy model (+ LoRA), tool servers, chat format, HF engine,
AgentLoop and RewardSet, built from a Recipe and torn down together.

In a synchronous run the engine generates with the trainer's own model object (no copy): after an optimizer step
the next rollout already uses the new weights. An asynchronous run's generator process builds its own side around
its own copy, fed by pushed weights. Left out: the training loops (`loop.py`, `async_loop.py`), vLLM (the verl
engine's job).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from rlfactory.models.loading import pad_id_of
from rlfactory.preflight import check_tool_schemas_fit
from rlfactory.recipe.schema import Recipe
from rlfactory.reward import RewardSet
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.tools.cache.factory import make_cache
from rlfactory.tools.manager import ToolManager

logger = logging.getLogger(__name__)


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


async def start_tool_side(recipe: Recipe, tokenizer: Any, run_dir: str | Path,
                          origin: str | None = None) -> tuple[Any, Any, Any, Any]:
    """The recipe's tool cache and started ToolManager (both None without `tools.mcp_configs`), RewardSet and
    ChatFormat: built the same way for the local engine and for verl's agent-loop workers. The embedded cache's file
    lives in `run_dir`. On failure, whatever was started is stopped again; else the caller stops it
    (`close_tool_side`)."""
    cache = tools = None
    try:
        if recipe.tools.mcp_configs:
            cache = make_cache(recipe.tools.cache, Path(run_dir) / "tool_cache.rdb")
            tools = ToolManager.from_recipe(recipe.tools, cache=cache, origin=origin)
            await tools.start()
        rewards = RewardSet.from_config(recipe.rewards, recipe.base_dir, cache=cache, file=recipe.source)
        chat = ChatFormat.for_rollout(tokenizer, tools.openai_schemas() if tools else None, recipe.rollout)
        if tools is not None:
            check_tool_schemas_fit(recipe, tokenizer, chat, tools.specs)  # before any rollout: they must fit
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
async def open_rollout_side(recipe: Recipe, model: Any, tokenizer: Any, device: Any, run_dir: str | Path,
                            weight_source: Any = None) -> AsyncIterator[RolloutSide]:
    """Start the tool servers and the engine; stop both on exit (also on errors and Ctrl-C). `weight_source`: the
    shared weights an asynchronous run's generator loads pushed versions from."""
    cache = tools = engine = None
    try:
        cache, tools, rewards, chat = await start_tool_side(recipe, tokenizer, run_dir)
        engine = HFEngine(model, pad_token_id=pad_id_of(tokenizer), eos_token_ids=chat.stop_token_ids,
                          max_batch_size=max(1, min(recipe.rollout.max_concurrent_trajectories, 256)),
                          device=device, tokenizer=tokenizer, weight_source=weight_source,
                          prefix_cache=recipe.rollout.prefix_cache)
        loop = AgentLoop(engine, tools, chat, recipe.rollout)
        yield RolloutSide(tokenizer, chat, engine, tools, loop, rewards, cache)
    finally:
        if engine is not None:
            await engine.close()
        await close_tool_side(tools, cache)
