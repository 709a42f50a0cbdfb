"""Hostile tool output through the real stdio transport (`rlfactory/tools/stdio_transport.py`), from the fuzz server
`bench/chaos.py` uses: a reply far past `max_message_bytes` is dropped as it arrives and its call gets an error
(with the SDK's reader, 50 MB took 21 s of the event loop and ~160 MB); replies the SDK cannot read (lone
surrogates, nesting past the parser's depth, bytes that are not UTF-8) answer their call at once instead of leaving
it to time out; and the session keeps serving."""
from __future__ import annotations

import sys
from pathlib import Path

import psutil
from mcp_helpers import child_pids, leftover_children, write_config

from rlfactory.tools.manager import ToolManager
from rlfactory.tools.stdio_transport import _Lines
from rlfactory.tools.types import ToolCall

FUZZ = Path(__file__).resolve().parents[2] / "bench" / "fuzz_server.py"


def config(tmp_path: Path, **settings) -> Path:
    entry = {"command": sys.executable, "args": [str(FUZZ), "--huge-mb", "24"],
             "rlfactory": {"tool_timeout_s": 120, "cache": False, **settings}}
    return write_config(tmp_path / "fuzz.json", {"fuzz": entry})


def emit(case: str, seed: int = 0) -> ToolCall:
    return ToolCall(name="emit", arguments={"case": case, "seed": seed})


async def test_a_reply_past_max_message_bytes_is_an_error_and_is_never_held(tmp_path):
    before = child_pids()
    async with ToolManager.from_files([config(tmp_path, max_message_bytes=4 * 2**20)]) as tm:
        await tm.call(emit("fuzz"))
        rss0 = psutil.Process().memory_info().rss
        huge = await tm.call(emit("huge"))
        grown_mb = (psutil.Process().memory_info().rss - rss0) / 2**20
        assert huge.is_error and huge.error_kind == "tool_error" and not huge.infra, huge.text
        assert "24,0" in huge.text and "max_message_bytes" in huge.text and "4,194,304" in huge.text, huge.text
        assert grown_mb < 64, f"a dropped 24 MB reply still grew the client by {grown_mb:.0f} MB"
        after = await tm.call(ToolCall(name="emit", arguments={"case": "binary", "seed": 1}))
        # the same session goes on (the reply's fake PNG is refused: an error result that says so, issue 39)
        assert after.error_kind == "bad_image" and "not an image" in after.text and tm.metrics()["tools/restarts"] == 0
    assert not leftover_children(before)


async def test_replies_the_sdk_cannot_read_answer_their_call_at_once(tmp_path):
    async with ToolManager.from_files([config(tmp_path)]) as tm:
        surrogates, nested, raw = await tm.call_many([emit("invalid_utf8"), emit("nested"), emit("raw_bytes")])
        # lone surrogates (JSON escapes of undecodable bytes) are read with replacement characters
        assert not surrogates.is_error and surrogates.text.startswith("before ") and "\ufffd" in surrogates.text
        surrogates.text.encode("utf-8")  # no lone surrogate reaches the tokenizer
        # 100,000 levels of structured content: an error result for this call, not a timeout
        assert nested.is_error and nested.error_kind == "tool_error" and "could not be read" in nested.text
        # bytes that are not UTF-8 become replacement characters
        assert not raw.is_error and "\ufffd" in raw.text
        again = await tm.call(emit("fuzz", 3))
        assert again.error_kind in (None, "tool_error", "bad_image") and tm.metrics()["tools/restarts"] == 0


def test_line_splitter_is_linear_and_drops_long_lines_keeping_their_id():
    lines = _Lines(limit=10)
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b':1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert lines.feed(b':3, "id": 7, "pad": "' + b"x" * 100) == []
    out = lines.feed(b'"}\nok\n')
    assert isinstance(out[0], tuple) and out[0][1] == len(b'{"c":3, "id": 7, "pad": "' + b"x" * 100 + b'"}')
    assert b'"id": 7' in out[0][0] and out[1] == b"ok"
