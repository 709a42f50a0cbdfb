"""The Qwen3 / Hermes tool-call format: parse the policy's `<tool_call>` blocks, render tool responses.

The policy writes, anywhere in its turn, one or more blocks

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "6*7"}}
    </tool_call>

`parse_tool_calls` turns them into `ToolCall`s. Everything that can go wrong (malformed JSON, a missing name,
arguments that are not an object, an unknown tool, a missing required argument, an unclosed tag, too many calls)
becomes an error `ToolResult` whose text tells the model what to fix — the parser never raises.

Tool results go back as messages `{"role": "tool", "content": ...}`; Qwen3's chat template wraps each one in
`<tool_response>...</tool_response>` inside a single user turn. `tool_messages` builds those messages and
`render_tool_response` produces the same body text without a template.

Lenient on purpose (models in training produce all of these): arguments given as a JSON *string* of an object,
`"parameters"` instead of `"arguments"`, a JSON list of calls inside one block, code fences around the JSON.
Left out: other formats (Llama's python-tag, Mistral's [TOOL_CALLS]), and full JSON-schema validation of arguments
(the server validates; here only required names are checked, to save a round-trip).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"

_LANG_TAG = re.compile(r"[A-Za-z]*")
_TAGS = re.compile(re.escape(OPEN_TAG) + "|" + re.escape(CLOSE_TAG))

# Error texts quote the model's own output back to it; keep such quotes short.
_QUOTE_CHARS = 200
_NAMES_LISTED = 30


@dataclass
class ParsedCalls:
    """What one assistant turn asked for, in the order it was written.

    `slots` holds, per `<tool_call>` block (or per list element inside one), either the `ToolCall` to run or the
    error `ToolResult` that answers it; a final error slot reports calls dropped over `max_calls`.
    """

    slots: list[ToolCall | ToolResult] = field(default_factory=list)

    @property
    def calls(self) -> list[ToolCall]:
        return [s for s in self.slots if isinstance(s, ToolCall)]

    @property
    def errors(self) -> list[ToolResult]:
        return [s for s in self.slots if isinstance(s, ToolResult)]

    def __bool__(self) -> bool:
        return bool(self.slots)

    def merge(self, results: Iterable[ToolResult]) -> list[ToolResult]:
        """Every response for this turn in the order the calls were written: `results` (one per `calls`, in
        order, as `ToolManager.call_many` returns them) interleaved with the parse errors."""
        it = iter(results)
        merged: list[ToolResult] = []
        for slot in self.slots:
            if isinstance(slot, ToolResult):
                merged.append(slot)
                continue
            try:
                merged.append(next(it))
            except StopIteration:
                raise ValueError(f"merge() got fewer results than the {len(self.calls)} parsed calls") from None
        if next(it, None) is not None:
            raise ValueError(f"merge() got more results than the {len(self.calls)} parsed calls")
        return merged


def _quote(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "…"


def _error(kind: str, message: str, name: str = "") -> ToolResult:
    return ToolResult(name=name, text=f"Error: {message}", is_error=True, error_kind=kind)


_FORMAT_HINT = 'Write each call as <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>.'


def strip_thinking(text: str) -> str:
    """The text without closed `<think>...</think>` blocks: a call drafted while thinking is not an action.
    An unclosed block is kept (it may hold the only call). Plain scanning, linear in the text's length."""
    if "<think>" not in text:
        return text
    parts: list[str] = []
    pos = 0
    while True:
        start = text.find("<think>", pos)
        end = text.find("</think>", start + 7) if start >= 0 else -1
        if start < 0 or end < 0:
            parts.append(text[pos:])
            return "".join(parts)
        parts.append(text[pos:start])
        pos = end + 8


def has_tool_call(text: str) -> bool:
    """True when the turn contains a `<tool_call>` outside closed thinking blocks (even a malformed one, which
    deserves an error response rather than being taken as a final answer)."""
    return OPEN_TAG in strip_thinking(text)


def _blocks(text: str) -> list[tuple[str | None, str]]:
    """(body, problem) per `<tool_call>`: body None means the block is unusable and `problem` says why."""
    out: list[tuple[str | None, str]] = []
    start: int | None = None  # index just past the currently open tag
    for m in _TAGS.finditer(text):
        if m.group() == OPEN_TAG:
            if start is not None:
                # A new block opened before the previous one closed: report the first, continue with the new one.
                out.append((None, f"a {OPEN_TAG} was not closed before the next {OPEN_TAG} "
                                  f"(it began with: {_quote(text[start:m.start()])!r})"))
            start = m.end()
        elif start is not None:
            out.append((text[start:m.start()], ""))
            start = None
        # A stray close tag with no open tag is ignored: there is no call to answer.
    if start is not None:
        out.append((None, f"{OPEN_TAG} was never closed with {CLOSE_TAG} "
                          f"(it began with: {_quote(text[start:])!r})"))
    return out


def _decode(body: str) -> tuple[Any, str]:
    """(value, problem) for one block's JSON body."""
    body = body.strip()
    if len(body) >= 6 and body.startswith("```") and body.endswith("```"):
        inner = body[3:-3]
        body = inner[_LANG_TAG.match(inner).end():].strip()  # type: ignore[union-attr]
    if not body:
        return None, f"an empty {OPEN_TAG} block"
    try:
        # strict=False: raw newlines/tabs inside strings are a common, harmless slip.
        return json.loads(body, strict=False), ""
    except RecursionError:
        return None, "the JSON in a tool call is nested too deeply"
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        return None, f"the tool call is not valid JSON ({e}): {_quote(body)!r}"


def _check_required(name: str, arguments: dict[str, Any], spec: ToolSpec) -> str:
    required = spec.input_schema.get("required") if isinstance(spec.input_schema, dict) else None
    if not isinstance(required, list):
        return ""
    missing = [r for r in required if isinstance(r, str) and r not in arguments]
    if not missing:
        return ""
    props = spec.input_schema.get("properties")
    known = ", ".join(sorted(props)) if isinstance(props, dict) and props else "none"
    return (f"tool {name!r} is missing required argument(s) {', '.join(map(repr, missing))} "
            f"(its arguments: {known})")


def _call_from(obj: Any, tools: Mapping[str, ToolSpec] | None) -> ToolCall | ToolResult:
    """One decoded call object → a ToolCall, or the error result that answers it."""
    if not isinstance(obj, dict):
        return _error("parse", f"a tool call must be a JSON object with \"name\" and \"arguments\", got "
                               f"{type(obj).__name__}: {_quote(json.dumps(obj, ensure_ascii=False, default=str))!r}. "
                               + _FORMAT_HINT)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return _error("parse", f"a tool call is missing the \"name\" string. {_FORMAT_HINT}")
    name = name.strip()
    if "arguments" in obj:
        arguments: Any = obj["arguments"]
    else:
        arguments = obj.get("parameters")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        # Some models (and OpenAI's wire format) send arguments as a JSON string of the object.
        if not arguments.strip():
            arguments = {}
        else:
            decoded, problem = _decode(arguments)
            if problem or not isinstance(decoded, dict):
                return _error("bad_arguments", f"the arguments of {name!r} must be a JSON object, got the string "
                                               f"{_quote(arguments)!r}", name)
            arguments = decoded
    if not isinstance(arguments, dict):
        return _error("bad_arguments", f"the arguments of {name!r} must be a JSON object, got "
                                       f"{type(arguments).__name__}", name)
    if tools is not None:
        spec = tools.get(name)
        if spec is None:
            names = sorted(tools)
            listed = ", ".join(names[:_NAMES_LISTED]) + (" …" if len(names) > _NAMES_LISTED else "")
            return _error("unknown_tool", f"unknown tool {name!r}. Available tools: {listed or 'none'}", name)
        problem = _check_required(name, arguments, spec)
        if problem:
            return _error("bad_arguments", problem, name)
    return ToolCall(name=name, arguments=arguments)


def parse_tool_calls(
    text: str, *, max_calls: int, tools: Mapping[str, ToolSpec] | None = None
) -> ParsedCalls:
    """Parse one assistant turn. Never raises; see the module docstring for what becomes an error result.

    `tools` maps the names the model may call to their specs; None skips the unknown-tool check.
    At most `max_calls` blocks are answered (runs or errors); the rest are dropped and one error says so.
    """
    parsed = ParsedCalls()
    if not isinstance(text, str) or OPEN_TAG not in text:
        return parsed
    items: list[ToolCall | ToolResult] = []
    for body, problem in _blocks(strip_thinking(text)):
        if body is None:
            items.append(_error("parse", problem + ". " + _FORMAT_HINT))
            continue
        value, problem = _decode(body)
        if problem:
            items.append(_error("parse", problem + ". " + _FORMAT_HINT))
        elif isinstance(value, list) and value:
            items.extend(_call_from(v, tools) for v in value)
        else:
            items.append(_call_from(value, tools))
    limit = max(0, max_calls)
    parsed.slots = items[:limit]
    if len(items) > limit:
        parsed.slots.append(_error(
            "parse",
            f"only the first {limit} calls were run; {len(items) - limit} more were ignored "
            f"(the limit is {limit} tool calls per turn)",
        ))
    return parsed


def cap_output(result: ToolResult, max_bytes: int) -> ToolResult:
    """`result` with its text cut to `max_bytes` UTF-8 bytes (at a character boundary) and a note of how much was
    cut; unchanged when it fits."""
    text = result.text
    if len(text) * 4 <= max_bytes:  # fits whatever the characters (UTF-8 takes at most 4 bytes each)
        return result
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return result
    kept = data[:max_bytes].decode("utf-8", errors="ignore")
    note = (f"\n[... output cut: {len(data) - len(kept.encode('utf-8'))} of {len(data)} bytes dropped, over this "
            f"server's max_output_bytes ({max_bytes})]")
    return result.model_copy(update={"text": kept + note})


def response_text(result: ToolResult, max_chars: int | None = None) -> str:
    """The content the model sees for one result: its text, marked as an error when it is one, cut to
    `max_chars` with a note saying how much was cut."""
    text = result.text
    if result.is_error and not text.lstrip().lower().startswith("error"):
        text = f"Error: {text}"
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut]"
    return text


def tool_messages(results: Iterable[ToolResult], max_chars: int | None = None) -> list[dict[str, str]]:
    """Chat messages for a turn's results, for `tokenizer.apply_chat_template` (one message per result)."""
    return [{"role": "tool", "name": r.name, "content": response_text(r, max_chars)} for r in results]


def render_tool_response(results: Iterable[ToolResult], max_chars: int | None = None) -> str:
    """The body of the user turn carrying the results, as Qwen3's template renders it (between
    `<|im_start|>user\\n` and `<|im_end|>`): one `<tool_response>` block per result, in order."""
    return "\n".join(
        f"{RESPONSE_OPEN}\n{response_text(r, max_chars)}\n{RESPONSE_CLOSE}" for r in results
    )
