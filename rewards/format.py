"""Format rewards and tool-use shaping: well-formed tool calls, answer tag, thinking block, penalties and bonuses.

These read the text and the tool-call records of a trajectory; none of them knows whether the answer is right (that
is `rewards/qa.py` or a judge). Typical recipe use: a small positive weight, or weight 0 to log them as metrics.
The tool-call check here is a deliberately short re-implementation of the Qwen3/Hermes format
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) so this file can be read and copied on its own.
"""
from __future__ import annotations

import json
import re
from typing import Any

_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _call_ok(body: str) -> bool:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return False
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return False
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string of an object
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return False
    return isinstance(args, dict)


def tool_calls_well_formed(completion: str) -> float:
    """Fraction of `<tool_call>` blocks that are closed and hold JSON with a `name` and object `arguments`.

    1.0 when the completion makes no call at all (nothing is malformed); an unclosed tag counts as a malformed call.
    """
    opened = completion.count("<tool_call>")
    if opened == 0:
        return 1.0
    good = sum(_call_ok(body) for body in _CALL_RE.findall(completion))
    return good / opened


def answer_tag_present(final_response: str) -> float:
    """1.0 if the final assistant turn holds a closed, non-empty `<answer>...</answer>`, else 0.0."""
    return float(any(body.strip() for body in _ANSWER_RE.findall(final_response)))


def _think_ok(text: str, required: bool) -> bool:
    opens, closes = text.count("<think>"), text.count("</think>")
    if opens == 0 and closes == 0:
        return not required
    # Exactly one block, opened first and placed at the start of the turn (Qwen3's layout).
    return opens == 1 and closes == 1 and text.lstrip().startswith("<think>") and text.index("<think>") < text.index(
        "</think>"
    )


def thinking_well_formed(trajectory: Any, required: bool = False) -> float:
    """Fraction of assistant turns whose `<think>` block is well formed: at most one, opened at the turn's start
    and closed. With `required=True` a turn without a block counts as malformed. 1.0 for a trajectory with no turns."""
    texts = [t.text for t in trajectory.turns if t.role == "assistant"]
    if not texts:
        return 1.0
    return sum(_think_ok(t, required) for t in texts) / len(texts)


def failed_tool_call_penalty(tool_calls: list, penalty_per_call: float = -0.5) -> float:
    """`penalty_per_call` for every tool call that came back as an error (bad JSON, unknown tool, timeout, ...)."""
    return penalty_per_call * sum(1 for c in tool_calls if c.is_error)


def too_many_tool_calls_penalty(tool_calls: list, max_calls: int = 4, penalty_per_call: float = -0.25) -> float:
    """`penalty_per_call` for every call beyond `max_calls` in the whole trajectory."""
    return penalty_per_call * max(0, len(tool_calls) - max_calls)


def _requires_tool(task: dict, key: str) -> bool:
    metadata = task.get("metadata") or {}
    return bool(task.get(key, metadata.get(key, False)))


def tool_use_required(
    tool_calls: list, task: dict, penalty: float = -1.0, bonus: float = 0.0, key: str = "requires_tool"
) -> float:
    """For tasks whose row (or row["metadata"]) sets `requires_tool`: `penalty` when no tool was called,
    `bonus` when at least one call succeeded. 0.0 for tasks that do not require a tool."""
    if not _requires_tool(task, key):
        return 0.0
    if not tool_calls:
        return penalty
    return bonus if any(not c.is_error for c in tool_calls) else 0.0


def tool_success_per_turn(
    trajectory: Any, success: float = 1.0, failure: float = -1.0, no_call: float = 0.0
) -> list[float]:
    """A step (process) reward: one score per assistant turn — `success` if every call that turn made succeeded,
    `failure` if any failed, `no_call` if it made none. Placed on the last token of each turn."""
    n_turns = sum(1 for t in trajectory.turns if t.role == "assistant")
    scores = [no_call] * n_turns
    for call in trajectory.tool_calls:
        if 0 <= call.turn < n_turns:
            if call.is_error:
                scores[call.turn] = failure
            elif scores[call.turn] != failure:
                scores[call.turn] = success
    return scores
