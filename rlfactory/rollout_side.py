"""The rollout side of a recipe: tool cache and servers, chat format, RewardSet, generation engine (HF or vLLM) and
AgentLoop, built together and torn down together. The local engine's loops, `rlfactory rollout` and `rlfactory eval`
use `open_rollout_side`; verl's agent-loop workers use `start_tool_side` (they bring verl's own engine).

The HF engine generates with the model object it is given: in a synchronous run the trainer's own, so that after an
optimizer step the next rollout already uses the new weights (`RolloutSide.shares_policy`). The vLLM engine
(`rollout.engine: vllm`) runs its own copy from a model folder and takes new weights by `update_weights` (between
synchronous steps) or by following pushed versions (`follow_weights`, an asynchronous run's generator).
Left out: the training loops (rlfactory/trainer/), verl's engine.
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from rlfactory.envs.protocol import fork_tools, takes_episode
from rlfactory.errors import ConfigError
from rlfactory.models.loading import pad_id_of
from rlfactory.models.vision import save_tokenizer, vision_of
from rlfactory.recipe.schema import Recipe
from rlfactory.reward import RewardSet
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import GenerationEngine
from rlfactory.tools.cache.base import ToolCache
from rlfactory.tools.cache.factory import make_cache
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.types import ToolSpec

logger = logging.getLogger(__name__)


@dataclass
class RolloutSide:
    """Everything a step needs to produce scored trajectories."""
    tokenizer: Any
    chat: ChatFormat
    engine: GenerationEngine
    tools: ToolManager | None
    loop: AgentLoop
    rewards: RewardSet
    cache: ToolCache | None
    shares_policy: bool
    """The engine generates with the model object it was given (HF): no weights to send it after an update."""


async def start_tool_side(recipe: Recipe, tokenizer: Any, run_dir: str | Path, origin: str | None = None
                          ) -> tuple[ToolCache | None, ToolManager | None, RewardSet, ChatFormat]:
    """The recipe's tool cache and started ToolManager (both None without `tools.mcp_configs`), RewardSet and
    ChatFormat: built the same way for the local engine and for verl's agent-loop workers. The embedded cache's file
    lives in `run_dir`. Tool schemas that alone fill the context are refused here, before any rollout. On failure,
    whatever was started is stopped again; else the caller stops it (`close_tool_side`)."""
    cache = tools = None
    try:
        if recipe.tools.mcp_configs:
            cache = make_cache(recipe.tools.cache, Path(run_dir) / "tool_cache.rdb")
            tools = ToolManager.from_recipe(recipe.tools, cache=cache, origin=origin)
            await tools.start()
        rewards = RewardSet.from_config(recipe.rewards, recipe.base_dir, cache=cache, file=recipe.source)
        chat = ChatFormat.for_rollout(tokenizer, tools.openai_schemas() if tools else None, recipe.rollout)
        if tools is not None:
            check_tool_schemas_fit(recipe, tokenizer, chat, tools.specs)
            check_can_branch(recipe, tools.specs, tools.loop_specs)
    except BaseException:
        await close_tool_side(tools, cache)
        raise
    return cache, tools, rewards, chat


def check_can_branch(recipe: Recipe, specs: list[ToolSpec], loop_specs: list[ToolSpec]) -> None:
    """With `rollout.branching`, every environment server (a tool taking `episode_id`) must list the loop-only
    `fork` tool; refused before any rollout otherwise. Stateless tools need nothing: a branch shares its root's
    calls and their results."""
    if recipe.rollout.branching.width <= 1:
        return
    holding = {s.server for s in specs if takes_episode(s)}
    forking = set(fork_tools(loop_specs))
    if holding - forking:
        raise ConfigError(f"rollout.branching: environment server(s) {', '.join(sorted(holding - forking))} cannot "
                          f"fork an episode (no `fork` tool in their tool list), so a group cannot branch in them; "
                          f"set rollout.branching.width: 1 or serve them with fork (docs/environments.md, "
                          f"\"Forking an episode\")", file=recipe.source)


async def close_tool_side(tools: ToolManager | None, cache: ToolCache | None) -> None:
    """Stop the tool servers, then the cache (the ToolManager leaves the cache, an embedded redis-server, to its
    owner). Closing the cache is best effort."""
    if tools is not None:
        await tools.close()
    if cache is not None:
        with contextlib.suppress(Exception):
            await cache.close()


@contextlib.asynccontextmanager
async def open_rollout_side(recipe: Recipe, model: Any, tokenizer: Any, device: Any,
                            run_dir: str | Path) -> AsyncIterator[RolloutSide]:
    """Start the tool servers and the engine; stop both on exit (also on errors and Ctrl-C)."""
    cache = tools = engine = None
    with contextlib.ExitStack() as scratch:
        try:
            cache, tools, rewards, chat = await start_tool_side(recipe, tokenizer, run_dir)
            if recipe.rollout.engine == "vllm":
                folder = vllm_model_folder(recipe, model, tokenizer, scratch)
                engine = _vllm_engine(recipe, model, folder, chat, device)
            else:
                engine = HFEngine(model, pad_token_id=pad_id_of(tokenizer), eos_token_ids=chat.stop_token_ids,
                                  max_batch_size=max(1, min(recipe.rollout.max_concurrent_trajectories, 256)),
                                  device=device, tokenizer=tokenizer, prefix_cache=recipe.rollout.prefix_cache,
                                  vision=vision_of(tokenizer))
            loop = AgentLoop(engine, tools, chat, recipe.rollout)
            yield RolloutSide(tokenizer, chat, engine, tools, loop, rewards, cache,
                              shares_policy=recipe.rollout.engine != "vllm")
        finally:
            if engine is not None:
                await engine.close()
            await close_tool_side(tools, cache)


def vllm_model_folder(recipe: Recipe, model: Any, tokenizer: Any, scratch: contextlib.ExitStack) -> Path:
    """An HF folder holding `model`'s weights and the tokenizer (and a VL policy's image processor), for vLLM to start
    from: `model.path` itself when it is such a folder and the weights are still its own, else the model saved into a
    temporary folder (removed when `scratch` closes)."""
    path = Path(recipe.model.path)
    own = (path.is_dir() and (path / "config.json").exists() and recipe.tokenizer.path is None
           and any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")))
    if own:
        return path
    folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="rlfactory-vllm-model-")))
    model.save_pretrained(folder)
    save_tokenizer(tokenizer, folder)  # vLLM expands image placeholders with the folder's processor
    return folder


def _vllm_engine(recipe: Recipe, model: Any, folder: Path, chat: ChatFormat, device: Any) -> GenerationEngine:
    from rlfactory.rollout.engines.vllm import VLLMEngine  # vllm is an extra: imported only when asked for

    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    on_gpu = str(device).startswith("cuda")
    return VLLMEngine.from_model_dir(folder, eos_token_ids=chat.stop_token_ids, dtype=dtype,
                                     max_model_len=recipe.rollout.max_context_tokens, seed=recipe.trainer.seed,
                                     gpu_memory_utilization=recipe.rollout.vllm_gpu_memory_utilization if on_gpu
                                     else None)


def check_tool_schemas_fit(recipe: Recipe, tokenizer: Any, chat: ChatFormat, specs: list[ToolSpec]) -> None:
    """Refuse (ConfigError) tool schemas that alone fill `rollout.max_context_tokens`: every trajectory would end
    at `context_length` before its first token and training would "succeed" at reward 0. Called once the servers
    have listed their tools and the prompt is first rendered with them, before any rollout. Names the sizes and the
    servers whose tools take the most tokens; warns when the schemas leave less room than one turn's tokens."""
    ro = recipe.rollout
    limit = ro.max_context_tokens
    empty = chat.prompt_messages("", None)  # the system turn with the schemas, and no task text
    with_tools = len(chat.prompt_ids(empty))
    if with_tools < limit:
        if limit - with_tools < ro.sampling.max_new_tokens_per_turn:
            logger.warning("the tool schemas leave %d of rollout.max_context_tokens (%d) for the task, observations "
                           "and answers: less than one turn (rollout.sampling.max_new_tokens_per_turn %d)",
                           limit - with_tools, limit, ro.sampling.max_new_tokens_per_turn)
        return
    bare = len(ChatFormat.for_rollout(tokenizer, None, ro).prompt_ids(empty))
    by_server: dict[str, list[ToolSpec]] = {}
    for spec in specs:
        by_server.setdefault(spec.server, []).append(spec)
    sizes = {name: len(ChatFormat.for_rollout(tokenizer, [s.to_openai() for s in group], ro).prompt_ids(empty)) - bare
             for name, group in by_server.items()}
    top = ", ".join(f"'{name}' {n} tokens ({len(by_server[name])} tools)"
                    for name, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    raise ConfigError(
        f"rollout.max_context_tokens ({limit}) cannot hold the tool schemas: the prompt before any task text is "
        f"already {with_tools} tokens, {with_tools - bare} of them the schemas of {len(specs)} tools, so every "
        f"trajectory would end at context_length with no token generated. Most tool tokens: {top}. Fix: start "
        f"fewer servers or tools (tools.servers in the recipe, or an mcpServers file with fewer of them), or raise "
        f"rollout.max_context_tokens well above {with_tools} (room for the task, observations and answers, within "
        f"the model's positions).", file=recipe.source)
