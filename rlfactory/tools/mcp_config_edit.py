"""Add one server to an `mcpServers` JSON file as text, leaving every other byte as its author wrote it.

`rlfactory new-tool` uses this: a load-and-dump round trip would re-lay the whole file (every compact array spread
over lines, key order and spacing changed) and lose what a person arranged. Here the file is scanned with the
standard JSON decoder to find where the `mcpServers` object ends, and the new entry goes in just after its last
member, laid out like its neighbours: one member per line at their indentation when they are on lines of their
own, on the same line when the object is written compactly.

Left out: removing or changing entries, and JSON with comments (JSONC): such a file is not valid JSON and is refused.
"""
from __future__ import annotations

import json
from typing import Any

from rlfactory.errors import ConfigError

_WS = " \t\n\r"
_decoder = json.JSONDecoder()

EMPTY_FILE = '{\n  "mcpServers": {}\n}\n'
"""The text a new config file starts from."""


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _object_members(text: str, start: int) -> tuple[list[tuple[str, int, int, int]], int]:
    """The members of the JSON object opening at `text[start]` ('{'): (key, key start, value start, value end) each,
    and the index of its closing '}'. The text is known to be valid JSON."""
    members: list[tuple[str, int, int, int]] = []
    i = _skip_ws(text, start + 1)
    if text[i] == "}":
        return members, i
    while True:
        key_start = i
        key, i = _decoder.raw_decode(text, i)
        i = _skip_ws(text, i) + 1  # past ':'
        value_start = _skip_ws(text, i)
        _, value_end = _decoder.raw_decode(text, value_start)
        members.append((key, key_start, value_start, value_end))
        i = _skip_ws(text, value_end)
        if text[i] == "}":
            return members, i
        i = _skip_ws(text, i + 1)  # past ','


def _line_indent(text: str, i: int) -> str:
    """The leading whitespace of the line holding `text[i]`."""
    line_start = text.rfind("\n", 0, i) + 1
    end = line_start
    while end < len(text) and text[end] in " \t":
        end += 1
    return text[line_start:end]


def _entry_text(name: str, entry: dict[str, Any], indent: str | None, unit: str, newline: str) -> str:
    """`"name": {...}`; one field per line at `indent + unit` when `indent` is given, else on one line. Field values
    stay compact (`"args": ["-m", "x"]`), as the shipped files write them."""
    fields = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in entry.items()]
    if indent is None:
        return f"{json.dumps(name)}: {{{', '.join(fields)}}}"
    inner = indent + unit
    return (f"{json.dumps(name)}: {{{newline}" + f",{newline}".join(inner + f for f in fields)
            + f"{newline}{indent}}}")


def add_server(text: str, name: str, entry: dict[str, Any], *, source: str = "config") -> str:
    """`text` (an mcpServers file) with `"name": entry` added as the last member of its `mcpServers` object.

    Raises ConfigError (naming `source`) when the text is not valid JSON, has no `mcpServers` object, or already
    defines `name`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}; fix it, or give another file "
                          "with --config", file=source) from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise ConfigError('top level must be {"mcpServers": {...}}; fix it, or give another file with --config',
                          file=source)
    if name in data["mcpServers"]:
        raise ConfigError(f"mcpServers.{name} already exists; pick another name", file=source)

    newline = "\r\n" if "\r\n" in text else "\n"
    members, _ = _object_members(text, _skip_ws(text, 0))
    # JSON keeps the last of repeated keys, and so did json.loads above: edit that one.
    _, servers_key, servers_start, _ = [m for m in members if m[0] == "mcpServers"][-1]
    servers, close = _object_members(text, servers_start)
    outer = _line_indent(text, servers_key)
    if servers:
        first_key, (_, _, last_start, last_end) = servers[0][1], servers[-1]
        if "\n" not in text[servers_start:first_key]:  # written compactly: keep it on the line
            return text[:last_end] + ", " + _entry_text(name, entry, None, "", newline) + text[last_end:]
        indent = _line_indent(text, first_key)
        unit = indent[len(outer):] if indent.startswith(outer) and len(indent) > len(outer) else "  "
        # One server per line stays so; servers spread over lines get a spread entry.
        spread = indent if "\n" in text[last_start:last_end] else None
        return (text[:last_end] + "," + newline + indent + _entry_text(name, entry, spread, unit, newline)
                + text[last_end:])
    # An empty object: `{}`, or braces with only whitespace between them.
    if "\n" not in text.strip():  # a one-line file stays one line
        return text[:servers_start + 1] + _entry_text(name, entry, None, "", newline) + text[close:]
    unit = outer or "  "  # the top level's own step, when it has one
    indent = outer + unit
    return (text[:servers_start + 1] + newline + indent + _entry_text(name, entry, indent, unit, newline) + newline
            + outer + text[close:])
