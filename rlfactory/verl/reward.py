"""rlfactory's reward functions as verl's custom reward function, for users who score on verl's reward path.

By default rlfactory scores in its agent loop (full Trajectory: exact turns, tool results, errors, latencies) and
verl skips its reward workers. When that is switched off (`actor_rollout_ref.rollout.custom.rlfactory.
score_in_loop=false` in `verl.extra_overrides`) or a user runs verl with another agent loop, verl calls

    compute_score(data_source, solution_str, ground_truth, extra_info, recipe_path=..., recipe_base_dir=...)

(`reward.custom_reward_function`, with the recipe path in its `reward_kwargs`). verl hands over text only: the
decoded response INCLUDING template and tool tokens. This module rebuilds a Trajectory from it: turns split at the
chat template's role markers (or, as verl decodes without special tokens, at the bare `user` / `assistant`
lines around `<tool_response>` blocks), tool calls parsed from the assistant turns and paired with the `<tool_response>`
blocks that follow (a response starting with "Error" counts as a failed call). Latencies and cache hits are unknown
here (0 / false). The task (answer, metadata) comes from `extra_info.task_json` (rows written by launch.prepare), else
from `ground_truth`. Returns {"score": weighted reward, "<function name>": component, ...}, the same keys for every
sample. Left out: per-turn (step) rewards, which verl's reward path cannot place: they are summed into the score.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

from rlfactory.recipe.schema import Recipe
from rlfactory.reward import RewardSet
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan
from rlfactory.tools.format import parse_tool_calls
from rlfactory.tools.types import ToolCall

logger = logging.getLogger(__name__)

_ROLE = re.compile(r"<\|im_start\|>(\w+)\n")
# verl decodes with skip_special_tokens=True: <|im_start|>/<|im_end|> are gone, role names stay on their own lines
_BARE_USER = re.compile(r"\n(user)\n(?=<tool_response>)")
_BARE_ASSISTANT = re.compile(r"(?<=</tool_response>)\n(assistant)\n")
_EMPTY_THINK = re.compile(r"^<think>\s*</think>\s*")
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)
_TURN_END = ("<|im_end|>", "<|endoftext|>")

_REWARD_SETS: dict[tuple[str, str | None], tuple[Any, Any]] = {}


def _reward_set(recipe_path: str, recipe_base_dir: str | None) -> tuple[Any, Any]:
    key = (str(recipe_path), recipe_base_dir)
    if key not in _REWARD_SETS:
        recipe = Recipe.from_yaml(recipe_path, base_dir=recipe_base_dir)
        _REWARD_SETS[key] = (recipe, RewardSet.from_config(recipe.rewards, recipe.base_dir, file=recipe.source))
    return _REWARD_SETS[key]


def _clean(text: str) -> str:
    text = text.rstrip("\n")
    for end in _TURN_END:
        if text.endswith(end):
            text = text[: -len(end)]
    return text


def trajectory_from_text(solution_str: str, task: dict[str, Any], max_calls: int = 64) -> Trajectory:
    """A Trajectory rebuilt from verl's decoded response (see the module docstring); token fields stay empty."""
    # segments: the first is the assistant's first turn; then (role, text) after each <|im_start|>role marker
    if "<|im_start|>" not in solution_str:
        solution_str = _BARE_ASSISTANT.sub(r"<|im_start|>\1\n", _BARE_USER.sub(r"<|im_start|>\1\n", solution_str))
    parts = _ROLE.split(solution_str)
    segments = [("assistant", parts[0])] + [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    traj = Trajectory(id=str(task.get("id", "sample")), task_id=str(task.get("id", "")) or None, prompt_ids=[],
                      task=task)
    pending: list[Any] = []  # the last assistant turn's call slots, waiting for their responses
    turn = -1
    for role, raw in segments:
        text = _clean(raw)
        if role == "assistant":
            text = _EMPTY_THINK.sub("", text)
            turn += 1
            traj.turns.append(TurnSpan(role="assistant", start=0, end=0, text=text))
            traj.messages.append({"role": "assistant", "content": text})
            pending = list(parse_tool_calls(text, max_calls=max_calls).slots)
        elif role in ("user", "tool") and "<tool_response>" in text:
            traj.turns.append(TurnSpan(role="tool", start=0, end=0, text=text))
            for slot, result in zip(pending, _RESPONSE.findall(text)):
                is_call = isinstance(slot, ToolCall)
                traj.tool_calls.append(ToolCallRecord(
                    turn=turn, name=slot.name, arguments=slot.arguments if is_call else None, result=result,
                    is_error=not is_call or result.lstrip().lower().startswith("error")))
                traj.messages.append({"role": "tool", "name": slot.name, "content": result})
            pending = []
    traj.finish_reason = "max_turns" if pending else "stop"
    return traj


def task_from_verl(ground_truth: Any, extra_info: Any) -> dict[str, Any]:
    extra = extra_info if isinstance(extra_info, dict) else {}
    if extra.get("task_json"):
        return json.loads(extra["task_json"])
    return {"id": str(extra.get("index", "")), "prompt": "", "answer": ground_truth, "metadata": extra}


async def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                        *, recipe_path: str, recipe_base_dir: str | None = None, **_: Any) -> dict[str, float]:
    """verl's reward-function signature, scored by the recipe's RewardSet (see the module docstring)."""
    recipe, rewards = _reward_set(recipe_path, recipe_base_dir)
    traj = trajectory_from_text(solution_str, task_from_verl(ground_truth, extra_info),
                                max_calls=recipe.rollout.max_tool_calls_per_turn)
    await rewards.score([traj])
    return score_fields(traj, rewards)


def score_fields(traj: Trajectory, rewards: Any) -> dict[str, float]:
    """A scored trajectory as verl's per-sample reward fields: `score`, `reward_failed` and `reward/<function>` for
    every function, the same keys for every sample (verl stacks them per key over the batch); a function that failed
    shows the failure value. Used by the agent loop (`reward_extra_info`) and by `compute_score`."""
    out = {"score": float(traj.reward if traj.reward is not None else rewards.failure_value),
           "reward_failed": float(traj.reward_failed)}
    for fn in rewards.functions:
        out[f"reward/{fn.name}"] = float(traj.reward_components.get(fn.name, rewards.failure_value))
    return out
