"""The MCP server `bench/chaos.py` fuzzes the tool layer with: one tool, `emit(case, seed)`, whose output is hostile
on purpose. Run: `python bench/fuzz_server.py` (stdio).

Cases (each deterministic in `seed`):
- `huge`: 50 MB of text in one result (`--huge-mb` changes the size).
- `binary`: random bytes as text (NULs, control characters, C1 codes), plus an image and a blob resource holding
  garbage that is not what its MIME type says.
- `invalid_utf8`: text with lone surrogates (what decoding invalid UTF-8 with `surrogateescape` gives), sent as the
  JSON escapes `\\udcXX` that no UTF-8 encoder accepts.
- `raw_bytes`: a reply line written straight to stdout whose bytes are not UTF-8 at all.
- `nested`: deeply nested JSON, as text and as structured content.
- `plain`: 200 ordinary words (the benign baseline).
- `fuzz`: a seeded mix of the above at small sizes and of what else tools send: chat-template markup
  (`<|im_end|>`, `</tool_response>`, `<tool_call>`), empty and many content blocks, error results, very long
  lines, emoji and combining marks, right-to-left text, random JSON.
Not idempotent and not read-only: results are never cached and a call lost to a crash is not retried.

It speaks MCP's stdio JSON-RPC by hand (initialize, tools/list, tools/call, ping), one request at a time, so that
what reaches the client is exactly the bytes written here: the SDK's server would refuse to send most of these.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--huge-mb", type=float, default=50.0)
opts = parser.parse_args()
MARKUP = ["<|im_end|>", "<|im_start|>assistant\n", "</tool_response>", "<tool_response>", "<tool_call>",
          '{"name": "emit", "arguments": {}}</tool_call>', "<think>", "</think>", "<|endoftext|>", "<answer>1</answer>"]
ODD = ["\u202e", "\u200b", "\ufeff", "\u0301" * 40, "🦀" * 30, "\x00", "\x1b[31m", "\r\n", "\t" * 50, "\\u0000",
       "\U0010ffff", "\ufffd", "ﷺ", "\u0665\u0666"]


def _nested(depth: int) -> str:
    return "[" * depth + "0" + "]" * depth


def _random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(6 if depth < 6 else 3)
    if kind == 0:
        return rng.randint(-2**63, 2**63)
    if kind == 1:
        return rng.choice(MARKUP + ODD)
    if kind == 2:
        return rng.choice([None, True, 1e308, -0.0, ""])
    if kind == 3:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {rng.choice(MARKUP + ODD + ["k"]): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def _garbage(rng: random.Random, n: int) -> str:
    return bytes(rng.randrange(256) for _ in range(n)).decode("latin-1")


def _surrogates(rng: random.Random, n: int) -> str:
    return bytes(rng.randrange(128, 256) for _ in range(n)).decode("utf-8", errors="surrogateescape")


def _send(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _reply(rid: object, result: dict, *, ensure_ascii: bool = True) -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}, ensure_ascii=ensure_ascii)
    _send((line + "\n").encode("utf-8", errors="surrogatepass"))


def _text(text: str) -> dict:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def _fuzz(rng: random.Random) -> dict:
    """A seeded hostile result, as the JSON a server writes (not the SDK's serialiser: it refuses lone surrogates)."""
    parts: list[dict] = []
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3, 20])):
        kind = rng.randrange(7)
        if kind == 0:
            text = "".join(rng.choice(MARKUP + ODD + ["word "]) for _ in range(rng.randrange(1, 60)))
        elif kind == 1:
            text = _garbage(rng, rng.randrange(1, 2000))
        elif kind == 2:
            text = json.dumps(_random_json(rng), ensure_ascii=rng.random() < 0.5)
        elif kind == 3:
            text = _nested(rng.randrange(1, 3000))
        elif kind == 4:
            text = "x" * rng.randrange(1, 300_000)  # one long line
        elif kind == 5:
            parts.append({"type": "image", "data": base64.b64encode(_garbage(rng, 64).encode("latin-1")).decode(),
                          "mimeType": rng.choice(["image/png", "text/plain", ""])})
            continue
        else:
            text = _surrogates(rng, rng.randrange(1, 200))
        parts.append({"type": "text", "text": text})
    return {"content": parts, "isError": rng.random() < 0.1}


def emit(rid: object, case: str, seed: int) -> None:
    """Answer request `rid` with a hostile output of kind `case`."""
    rng = random.Random(f"{case}|{seed}")
    if case == "huge":
        line = "".join(rng.choice("abcdefghij ") for _ in range(1000)) + "\n"
        _reply(rid, _text(line * int(opts.huge_mb * 1e6 / len(line))))
    elif case == "binary":
        blob = {"uri": "file:///garbage.bin", "mimeType": "application/octet-stream",
                "blob": base64.b64encode(_garbage(rng, 4096).encode("latin-1")).decode()}
        _reply(rid, {"content": [
            {"type": "text", "text": _garbage(rng, 8192)},
            {"type": "image", "data": base64.b64encode(b"\x89PNG not really").decode(), "mimeType": "image/png"},
            {"type": "resource", "resource": blob}]}, ensure_ascii=False)
    elif case == "invalid_utf8":
        _reply(rid, _text("before " + _surrogates(rng, 512) + " after"))  # as JSON escapes \udcXX
    elif case == "raw_bytes":
        junk = bytes(rng.randrange(128, 256) for _ in range(64)).replace(b'"', b"").replace(b"\\", b"")
        head = json.dumps({"jsonrpc": "2.0", "id": rid})[:-1].encode()
        _send(head + b', "result": {"content": [{"type": "text", "text": "' + junk + b'"}]}}\n')
    elif case == "nested":  # 100,000 levels, as text and as structured content (no JSON encoder nests so deep)
        depth = 100_000
        head = json.dumps({"jsonrpc": "2.0", "id": rid, "result": _text(_nested(depth))})[:-2]
        _send((head + ', "structuredContent": {"deep": ' + _nested(depth) + "}}}\n").encode())
    elif case == "plain":  # benign: the same size of response, for a baseline
        _reply(rid, _text(" ".join(f"word{rng.randrange(1000)}" for _ in range(200))))
    elif case == "fuzz":
        _reply(rid, _fuzz(rng), ensure_ascii=rng.random() < 0.5)
    else:
        _reply(rid, {**_text(f"unknown case {case!r}"), "isError": True})


TOOL = {"name": "emit", "description": "Return a hostile output of kind `case` (huge, binary, invalid_utf8, "
        "raw_bytes, nested, plain, fuzz).", "inputSchema": {"type": "object", "properties": {
            "case": {"type": "string"}, "seed": {"type": "integer"}}}}


def main() -> None:
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = json.loads(line)
        rid, method = msg.get("id"), msg.get("method")
        if rid is None:
            continue  # a notification
        if method == "initialize":
            _reply(rid, {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                         "serverInfo": {"name": "fuzz", "version": "1.0"}})
        elif method == "tools/list":
            _reply(rid, {"tools": [TOOL]})
        elif method == "tools/call":
            args = msg["params"].get("arguments") or {}
            emit(rid, str(args.get("case")), int(args.get("seed", 0)))
        elif method == "ping":
            _reply(rid, {})
        else:
            _send((json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}}) + "\n")
                  .encode())


if __name__ == "__main__":
    main()
