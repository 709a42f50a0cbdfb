"""One tool turn as the policy reads it: a turn's tool results, in the order of its `<tool_call>` blocks, become the
tool messages (each result's text cut to its budget, then the images a vision-language policy is shown, or a note
for each it cannot see), the record of every call, and the images kept for the viewer only
(`rollout.keep_unseen_images`). The AgentLoop renders the messages' token delta and keeps the turn when it fits.

Left out: running the calls (the ToolManager), the chat template's delta (`ChatFormat.tool_response_delta`), the
images' token records (`images.records`, made where the delta lands) and the truncation rule (the loop's, given as
a function).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.images import message_content, tool_content, unseen
from rlfactory.rollout.trajectory import SavedImage, ToolCallRecord
from rlfactory.tools.format import response_text
from rlfactory.tools.types import ToolCall, ToolImage, ToolResult


@dataclass
class ToolTurn:
    """What a turn's results add to a trajectory."""

    messages: list[dict[str, Any]]
    """One tool message per result, for the chat template."""
    shown: list[ToolImage]
    """The images the policy is shown, in order."""
    shown_by: list[str]
    """The tool that returned each shown image."""
    calls: list[ToolCallRecord]
    """The record of each call (a malformed one's too: its error result)."""
    unseen: list[SavedImage]
    """Images returned but not shown, kept for the viewer (empty unless asked for)."""


def tool_turn(chat: ChatFormat, slots: list[ToolCall | ToolResult], results: list[ToolResult], *, turn: int,
              truncate: Callable[..., str], keep_unseen: bool) -> ToolTurn:
    """The turn of `results` (one per slot of the parsed calls: a call that ran, or a parse error's result);
    `truncate(text, error=...)` cuts a result's text to its budget."""
    out = ToolTurn([], [], [], [], [])
    for slot, result in zip(slots, results):
        seen = truncate(chat.neutralize(response_text(result)), error=result.is_error)
        seen, images = tool_content(chat, seen, result.images)
        out.messages.append({"role": "tool", "name": result.name, "content": message_content(seen, images)})
        out.shown += images
        out.shown_by += [result.name] * len(images)
        if keep_unseen:
            out.unseen += unseen(result.images, images, turn=turn, tool=result.name)
        out.calls.append(ToolCallRecord(
            turn=turn, name=result.name, arguments=slot.arguments if isinstance(slot, ToolCall) else None,
            result=seen, is_error=result.is_error, error_kind=result.error_kind, latency_s=result.latency_s,
            cached=result.cached, cache_origin=result.cache_origin if result.cached else None,
            structured=result.structured, infra=result.infra, retried=result.retried,
            images=[im.sha256 for im in images]))
    return out
