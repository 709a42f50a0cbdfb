"""rlfactory's AgentLoop inside verl's agent-loop machinery: the ONLY module importing verl's agent-loop API.

verl builds one `RLFactoryAgentLoop` per sample (from `agent_loop.yaml`, with the recipe path as a constructor
argument) inside each agent-loop worker, a Ray actor with one event loop. Per worker process and event loop, the
first sample builds (and later samples reuse) a `_WorkerState`: the recipe, tokenizer, ChatFormat, RewardSet and ONE
ToolManager with its MCP server processes; the tool cache is the recipe's Redis URL (one Redis for the cluster) or
an embedded Redis file in the run folder. Each sample then:

    task (from extra_info.task_json, else raw_prompt) -> horizon from `global_steps` (ScalingInter-RL)
    -> AgentLoop.run_one over `VerlServerEngine` (verl's `server_manager.generate`, token ids in and out)
    -> RewardSet.score -> reward_score (+ reward_extra_info) -> truncation to verl's prompt/response lengths
    -> AgentLoopOutput with response_mask == our loss_mask

verl's `global_steps` counts from 1 (step 1 is the first update); our schedules count from 0, hence `step - 1`.
Left out: verl's own tool registry and ToolAgentLoop (we use our ToolManager), multimodal inputs, step rewards (a
verl sample carries one reward on its last token: per-turn rewards are summed into it).
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf
from pydantic import TypeAdapter
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from rlfactory.models.loading import load_tokenizer
from rlfactory.recipe.rollout import HorizonConfig
from rlfactory.recipe.schema import Recipe
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams
from rlfactory.rollout.gate import TrajectoryGate
from rlfactory.rollout.horizon import horizon_for_step
from rlfactory.rollout_side import close_tool_side, start_tool_side
from rlfactory.verl.records import RolloutRecorder
from rlfactory.verl.reward import score_fields

logger = logging.getLogger(__name__)


class VerlServerEngine:
    """`GenerationEngine` over verl's `server_manager.generate(request_id, prompt_ids=, sampling_params=)`.

    Temperature/top-p/top-k come from verl's sampling params (so validation's greedy settings hold); the per-turn
    token limit and stop tokens come from our loop. One request id per trajectory keeps every turn on the same
    server (verl routes by it), where the conversation so far is in the prefix cache.

    It also keeps the range of policy versions (verl's `global_steps` of the weights that served each turn) that
    produced the trajectory: verl's trainer reads it back from the sample (`min_global_steps`, `max_global_steps`)
    for its staleness metrics and off-policy bookkeeping."""

    def __init__(self, server_manager: Any, verl_sampling: dict[str, Any], request_id: str | None = None):
        self.server_manager = server_manager
        self.verl_sampling = dict(verl_sampling)
        self.request_id = request_id or uuid.uuid4().hex
        self.min_global_steps: int | None = None
        self.max_global_steps: int | None = None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       request_id: str | None = None) -> GenerationOutput:
        params = dict(self.verl_sampling)
        params["max_tokens"] = sampling.max_new_tokens
        stop = sorted(set(sampling.stop_token_ids))
        if stop:
            params["stop_token_ids"] = stop
        out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=params)
        if out.stop_reason == "aborted":
            raise RuntimeError("verl aborted the generation request (weights were being updated)")
        extra = getattr(out, "extra_fields", None) or {}
        for key, pick in (("min_global_steps", min), ("max_global_steps", max)):
            version = extra.get(key, extra.get("global_steps"))
            if version is not None:
                seen = getattr(self, key)
                setattr(self, key, int(version) if seen is None else pick(seen, int(version)))
        ids = list(out.token_ids)
        logprobs = list(out.log_probs) if out.log_probs is not None else None
        finish = "stop" if ids and ids[-1] in stop else "length"
        return GenerationOutput(token_ids=ids, logprobs=logprobs, finish_reason=finish)

    async def update_weights(self, state_dict: Any) -> None:  # verl syncs weights into its servers itself
        return None

    async def close(self) -> None:
        return None


@dataclass
class _WorkerState:
    recipe: Recipe
    chat: Any
    tools: Any
    rewards: Any
    cache: Any
    recorder: RolloutRecorder
    gate: TrajectoryGate
    """This worker's samples in flight (no more than its environment servers hold episodes)."""


_STATES: dict[tuple[str, int], _WorkerState] = {}
_LOCKS: dict[tuple[str, int], asyncio.Lock] = {}


async def worker_state(recipe_path: str, recipe_base_dir: str | None) -> _WorkerState:
    """The per-process, per-event-loop tools/chat/rewards, built once (tool servers start here)."""
    key = (str(recipe_path), id(asyncio.get_running_loop()))
    if key in _STATES:
        return _STATES[key]
    lock = _LOCKS.setdefault(key, asyncio.Lock())
    async with lock:
        if key in _STATES:
            return _STATES[key]
        recipe = Recipe.from_yaml(recipe_path, base_dir=recipe_base_dir)
        node = node_id()
        cache, tools, rewards, chat = await start_tool_side(recipe, load_tokenizer(recipe), recipe.trainer.output_dir,
                                                            origin=node)
        recorder = RolloutRecorder(recipe.trainer.output_dir, node)
        gate = TrajectoryGate.sized(recipe.rollout.max_concurrent_trajectories, tools)
        _STATES[key] = _WorkerState(recipe, chat, tools, rewards, cache, recorder, gate)
        logger.info("agent-loop worker ready: %d tool(s), %d reward function(s)",
                    len(tools.specs) if tools else 0, len(rewards.functions))
        return _STATES[key]


async def close_worker_states() -> None:
    """Stop the tool servers (and caches) this process started on the running event loop."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _STATES if k[1] == loop_id]:
        st = _STATES.pop(key)
        _LOCKS.pop(key, None)
        await close_tool_side(st.tools, st.cache)


def _plain(value: Any) -> Any:
    """numpy scalars/arrays from verl's non-tensor batch -> Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return value


def task_from_sample(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Our task dict from a verl sample: `extra_info.task_json` (rows written by launch.prepare), else the raw chat
    prompt and `reward_model.ground_truth` (any verl dataset)."""
    extra = _plain(kwargs.get("extra_info")) or {}
    if isinstance(extra, dict) and extra.get("task_json"):
        return json.loads(extra["task_json"])
    reward_model = _plain(kwargs.get("reward_model")) or {}
    return {"id": str(extra.get("index", "")) if isinstance(extra, dict) else "",
            "prompt": [dict(m) for m in _plain(kwargs["raw_prompt"])],
            "answer": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            "metadata": extra if isinstance(extra, dict) else {}}


# uid -> samples of that group started so far in this worker process. verl's v1 trainer passes each sample's number
# as `session_id` (its TransferQueue worker runs the `rollout.n` samples of a prompt itself), and that is used when
# present. The v0 trainer passes none (its `rollout_n` only reaches tracing), but it repeats a prompt's rows
# `rollout.n` times under one `uid`, consecutively and (with batches that split evenly over the agent-loop workers)
# on one worker; so there counting per uid gives each sample of a GRPO group its own index and trajectory id.
_GROUP_COUNTS: "OrderedDict[str, int]" = OrderedDict()
_GROUP_COUNTS_MAX = 65_536  # uids are fresh every step: keep the most recent ones only


def next_sample_index(group_id: str) -> int:
    """0, 1, 2, ... for successive samples of one group (uid) in this process; the oldest uids are forgotten."""
    index = _GROUP_COUNTS.pop(group_id, 0)
    _GROUP_COUNTS[group_id] = index + 1
    while len(_GROUP_COUNTS) > _GROUP_COUNTS_MAX:
        _GROUP_COUNTS.popitem(last=False)
    return index


def node_id() -> str:
    """The Ray node this process runs on (records name it, so a multi-node run shows which node served what)."""
    if not ray.is_initialized():  # not inside Ray (tests drive the loop in-process); asking would start a Ray
        return socket.gethostname()
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return socket.gethostname()


def horizon_at(horizon_cfg: HorizonConfig, global_steps: Any) -> int:
    """Max assistant turns at verl's `global_steps` (1-based; absent on verl's v0 trainer -> the first stage)."""
    step = 0 if global_steps is None else max(int(_plain(global_steps)) - 1, 0)
    return horizon_for_step(horizon_cfg, step)


class RLFactoryAgentLoop(AgentLoopBase):
    """One sample of verl's batch rolled out by rlfactory's AgentLoop (see the module docstring)."""
    def __init__(self, *args: Any, recipe_path: str, recipe_base_dir: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.recipe_path = recipe_path
        self.recipe_base_dir = recipe_base_dir
        custom = (self.rollout_config.get("custom") or {}).get("rlfactory") or {}
        self.horizon_cfg_raw = custom.get("horizon")
        self.score_in_loop = bool(custom.get("score_in_loop", True))

    def _horizon_cfg(self, recipe: Recipe) -> HorizonConfig:
        """The schedule from verl's config (`rollout.custom.rlfactory.horizon`), else the recipe's."""
        if not self.horizon_cfg_raw:
            return recipe.rollout.horizon


        raw = self.horizon_cfg_raw
        raw = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else dict(raw)
        return TypeAdapter(HorizonConfig).validate_python(raw)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        st = await worker_state(self.recipe_path, self.recipe_base_dir)
        task = task_from_sample(kwargs)
        horizon = horizon_at(self._horizon_cfg(st.recipe), kwargs.get("global_steps"))
        engine = VerlServerEngine(self.server_manager, sampling_params)
        loop = AgentLoop(engine, st.tools, st.chat, st.recipe.rollout)
        uid = str(_plain(kwargs.get("uid", "")) or task.get("id") or "")
        session = _plain(kwargs.get("session_id"))
        sample_index = int(session) if session is not None else next_sample_index(uid) if uid else 0
        async with st.gate.one():
            traj = await loop.run_one(task, sample_index=sample_index, group_id=uid or None, horizon=horizon)
        if traj.finish_reason == "error":  # a failed rollout is data: kept, scored, but none of it is trained on
            traj.loss_mask = [0] * len(traj.response_ids)
        extra_info: dict[str, float] = {}
        reward_score = None
        reward_metrics = None
        if self.score_in_loop:
            reward_metrics = await st.rewards.score([traj])
            extra_info = score_fields(traj, st.rewards)
            reward_score = extra_info["score"]
        step = int(_plain(kwargs.get("global_steps")) or 0)
        versions = (engine.min_global_steps if engine.min_global_steps is not None else step,
                    engine.max_global_steps if engine.max_global_steps is not None else step)
        st.recorder.write(global_step=step, horizon=horizon, trajectory=traj, reward_metrics=reward_metrics,
                          tool_counters=st.tools.counters() if st.tools is not None else None)
        return self._output(traj, reward_score, extra_info, horizon, sampling_params, versions)

    def _output(self, traj: Any, reward_score: float | None, extra_info: dict[str, float], horizon: int,
                sampling_params: dict[str, Any], versions: tuple[int, int]) -> AgentLoopOutput:
        prompt_len, response_len = self.rollout_config.prompt_length, self.rollout_config.response_length
        prompt_ids = list(traj.prompt_ids)
        response_ids = list(traj.response_ids)[:response_len]
        mask = list(traj.loss_mask)[:response_len]
        if len(prompt_ids) > prompt_len:
            # verl's tensors hold prompt_length tokens; a cut prompt is not what the policy saw, so the sample is
            # kept for its reward (group statistics) but none of it is trained on
            logger.warning("prompt of %d tokens exceeds verl's prompt length %d (rollout.max_context_tokens - "
                           "max_response_tokens): left-truncated and masked out", len(prompt_ids), prompt_len)
            prompt_ids = prompt_ids[-prompt_len:]
            mask = [0] * len(mask)
            traj.error = traj.error or f"prompt of {len(traj.prompt_ids)} tokens cut to {prompt_len}"
        if traj.infra_failed:
            # a tool server lost or down under one of its calls (or a rollout that raised): no signal about the
            # policy, so none of it is trained (verl still counts its reward in the group's statistics)
            mask = [0] * len(mask)
        logprobs = None
        if sampling_params.get("logprobs"):
            logprobs = [float(x) for x in traj.logprobs[:response_len]]
        metrics = AgentLoopMetrics(generate_sequences=traj.timings.get("generate_s", 0.0),
                                   tool_calls=traj.timings.get("tools_s", 0.0))
        extra_fields: dict[str, Any] = {
            "rlf_finish_reason": traj.finish_reason, "rlf_horizon": horizon, "rlf_tool_calls": len(traj.tool_calls),
            "rlf_tool_errors": sum(c.is_error for c in traj.tool_calls), "rlf_error": traj.error or "",
            "rlf_infra_failed": int(traj.infra_failed),
            "rlf_trajectory_id": traj.id,
            # the policy versions that produced the trajectory, for verl's staleness accounting
            "min_global_steps": versions[0], "max_global_steps": versions[1],
        }
        if reward_score is not None:
            extra_fields["reward_extra_info"] = extra_info
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask, response_logprobs=logprobs,
            reward_score=reward_score, num_turns=1 + len(traj.turns), metrics=metrics, extra_fields=extra_fields,
        )

