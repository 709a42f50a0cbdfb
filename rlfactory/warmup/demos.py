"""Demonstrations for supervised warm-up, made through the real MCP tools, and the arithmetic tasks they solve.

A demonstration is a transcript (`{"id", "messages", "tools", "answer", "style"}`) written by a scripted policy:
- `tool` style: the assistant emits a correct `<tool_call>` for the task, the REAL tool (through the ToolManager, so
  the same server, arguments and response text as in rollouts) answers, and the assistant copies the tool's result
  into `<answer>...</answer>`.
  A tool that answers with a picture (the digits_image server's `calculator_picture`: MCP `ImageContent`, no text)
  gives a tool message whose content is parts: its text, if any, then one `{"type": "image", "data_b64", "mime_type",
  ...}` part per image; the assistant answers the task's reference answer, which the picture shows (a picture is not
  compared with the answer: the server draws the calculator's exact result).
- `direct` style: the assistant answers `<answer>...</answer>` at once with the reference answer. For tasks whose
  answer the model cannot compute (4-digit multiplication for a 3 M-parameter model) this teaches the *form* of a
  direct answer but not its content, so a warmed-up model sometimes calls the tool and sometimes guesses: the mix
  that gives GRPO groups with different rewards to learn from (see ../shared/notes/quickstart-feasibility.md).

Left out: demonstrations for other tools (a scripted policy is task-specific; add one beside `calculator_policy`) and
any filtering by model quality (demos are right by construction, checked against the task's reference answer).
"""
from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from rlfactory.tools.format import response_text
from rlfactory.tools.types import ToolCall, ToolImage

logger = logging.getLogger(__name__)

_EXPR_RE = re.compile(r"(\d+)\s*([*+\-x×])\s*(\d+)")


def make_arithmetic_tasks(
    n: int, seed: int, digits: Sequence[int] = (3, 4), op: str = "*", id_prefix: str = "calc"
) -> list[dict[str, Any]]:
    """`n` tasks "What is A * B?" with A, B of the given digit counts (drawn per operand); fields prompt/answer/id."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = (rng.randint(10 ** (d - 1), 10 ** d - 1) for d in (rng.choice(digits), rng.choice(digits)))
        value = {"*": a * b, "+": a + b, "-": a - b}[op]
        tasks.append({"id": f"{id_prefix}-{seed}-{i}", "prompt": f"What is {a} {op} {b}?", "answer": str(value)})
    return tasks


def arithmetic_expression(prompt: str) -> str:
    """The calculator expression a task prompt asks for ("What is 4817 * 2931?" -> "4817*2931")."""
    m = _EXPR_RE.search(prompt)
    if not m:
        raise ValueError(f"no arithmetic expression in the task prompt {prompt!r}")
    op = "*" if m.group(2) in "x×" else m.group(2)
    return f"{m.group(1)}{op}{m.group(3)}"


def calculator_policy(task: dict[str, Any], tool_name: str = "calculator") -> dict[str, Any]:
    """The scripted call for an arithmetic task: the tool and its arguments."""
    return {"name": tool_name, "arguments": {"expression": arithmetic_expression(str(task["prompt"]))}}


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The Qwen3/Hermes tool-call text exactly as the chat template renders an assistant tool call."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def answer_text(value: str) -> str:
    return f"<answer>{value.strip()}</answer>"


def tool_demo(task: dict[str, Any], call: dict[str, Any], tool_text: str,
              images: Sequence[ToolImage] = ()) -> dict[str, Any]:
    """A transcript: user prompt, the call, the real tool response (as the model sees it), the answer copied (the
    task's reference answer when the result is a picture: `images`)."""
    content: str | list[dict[str, Any]] = tool_text
    if images:
        content = ([{"type": "text", "text": tool_text}] if tool_text else []) + [
            {"type": "image", **im.model_dump()} for im in images]
    return {
        "id": task.get("id"),
        "style": "tool",
        "answer": task.get("answer"),
        "messages": [
            {"role": "user", "content": task["prompt"]},
            {"role": "assistant", "content": render_tool_call(call["name"], call["arguments"])},
            {"role": "tool", "content": content},
            {"role": "assistant", "content": answer_text(str(task["answer"]) if images else tool_text)},
        ],
    }


def direct_demo(task: dict[str, Any]) -> dict[str, Any]:
    """A transcript that answers at once with the reference answer (no tool)."""
    return {
        "id": task.get("id"),
        "style": "direct",
        "answer": task.get("answer"),
        "messages": [
            {"role": "user", "content": task["prompt"]},
            {"role": "assistant", "content": answer_text(str(task["answer"]))},
        ],
    }


async def generate_demos(
    tasks: Sequence[dict[str, Any]],
    manager: Any,
    *,
    direct_fraction: float = 0.0,
    seed: int = 0,
    policy: Callable[[dict[str, Any]], dict[str, Any]] = calculator_policy,
    system_prompt: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Demonstrations for `tasks`: tool-use transcripts through `manager` (a started ToolManager), with a share
    `direct_fraction` answered directly instead. Returns the transcripts and counts (tool errors, wrong results).

    Tool results that disagree with a task's reference answer are dropped (and counted): a demo must be right.
    """
    rng = random.Random(seed)
    tools = [spec.to_openai() for spec in manager.specs]
    direct_ids = {i for i in range(len(tasks)) if rng.random() < direct_fraction}
    calls = {i: policy(t) for i, t in enumerate(tasks) if i not in direct_ids}
    results = await manager.call_many(
        [ToolCall(name=c["name"], arguments=c["arguments"], id=str(i)) for i, c in calls.items()]
    )
    by_index = dict(zip(calls.keys(), results))
    demos, stats = [], {"tool": 0, "direct": 0, "tool_errors": 0, "wrong_results": 0, "pictures": 0}
    for i, task in enumerate(tasks):
        if i in direct_ids:
            demo = direct_demo(task)
        else:
            res = by_index[i]
            if res.is_error:
                stats["tool_errors"] += 1
                continue
            if res.images:
                if task.get("answer") is None:
                    raise ValueError(f"task {task.get('id')!r}: a picture result needs the task's answer to copy")
                stats["pictures"] += 1
                demo = tool_demo(task, calls[i], res.text, res.images)
            elif task.get("answer") is not None and res.text.strip() != str(task["answer"]).strip():
                stats["wrong_results"] += 1
                continue
            else:
                demo = tool_demo(task, calls[i], response_text(res))
        if system_prompt:
            demo["messages"].insert(0, {"role": "system", "content": system_prompt})
        demo["tools"] = tools
        stats[demo["style"]] += 1
        demos.append(demo)
    if stats["tool_errors"] or stats["wrong_results"]:
        logger.warning("demos: %d tool errors and %d results unequal to the reference answer were dropped",
                       stats["tool_errors"], stats["wrong_results"])
    return demos, stats


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
