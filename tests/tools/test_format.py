"""The Qwen3/Hermes tool-call format: exact parsing cases, rendering, and a fuzz test that it never raises."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfactory.tools.format import (
    ParsedCalls,
    has_tool_call,
    parse_tool_calls,
    render_tool_response,
    response_text,
    tool_messages,
)
from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec

TOOLS = {
    "calculator": ToolSpec(
        name="calculator", server="calc", tool="calculator",
        input_schema={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    ),
    "search": ToolSpec(
        name="search", server="search", tool="search",
        input_schema={"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
                      "required": ["query"]},
    ),
}
ERROR_KINDS = {"parse", "unknown_tool", "bad_arguments"}


def call(name: str, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# ---------------------------------------------------------------- exact cases

def test_single_call_qwen3_layout():
    text = "Let me compute.\n" + call("calculator", {"expression": "6*7"})
    parsed = parse_tool_calls(text, max_calls=4, tools=TOOLS)
    assert parsed.calls == [ToolCall(name="calculator", arguments={"expression": "6*7"})]
    assert parsed.errors == []


def test_several_calls_keep_their_order():
    text = call("search", {"query": "a"}) + " and " + call("calculator", {"expression": "1"}) + call(
        "search", {"query": "b", "top_k": 2})
    parsed = parse_tool_calls(text, max_calls=8, tools=TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("search", {"query": "a"}), ("calculator", {"expression": "1"}), ("search", {"query": "b", "top_k": 2})]


def test_no_call_is_empty():
    parsed = parse_tool_calls("The answer is 42.", max_calls=4, tools=TOOLS)
    assert not parsed and parsed.calls == [] and parsed.errors == []
    assert not has_tool_call("The answer is 42. </tool_call>")


def test_malformed_json_is_an_error_for_the_model():
    parsed = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {</tool_call>', max_calls=4)
    assert parsed.calls == []
    [err] = parsed.errors
    assert err.is_error and err.error_kind == "parse"
    assert err.text.startswith("Error: the tool call is not valid JSON")
    assert '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>' in err.text


def test_missing_name():
    [err] = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>', max_calls=4).errors
    assert err.error_kind == "parse" and 'missing the "name"' in err.text


def test_arguments_not_an_object():
    [err] = parse_tool_calls('<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>', max_calls=4).errors
    assert err.error_kind == "bad_arguments" and err.name == "search"
    assert "must be a JSON object, got list" in err.text


def test_arguments_as_json_string_of_an_object_are_accepted():
    text = '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"paris\\"}"}</tool_call>'
    assert parse_tool_calls(text, max_calls=4, tools=TOOLS).calls == [
        ToolCall(name="search", arguments={"query": "paris"})]
    bad = '<tool_call>{"name": "search", "arguments": "paris"}</tool_call>'
    [err] = parse_tool_calls(bad, max_calls=4, tools=TOOLS).errors
    assert err.error_kind == "bad_arguments" and "'paris'" in err.text


def test_lenient_variants():
    # "parameters" instead of "arguments", missing arguments, code fences, a list of calls in one block.
    assert parse_tool_calls('<tool_call>{"name": "search", "parameters": {"query": "x"}}</tool_call>',
                            max_calls=4).calls == [ToolCall(name="search", arguments={"query": "x"})]
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>', max_calls=4).calls == [
        ToolCall(name="now", arguments={})]
    fenced = '<tool_call>\n```json\n{"name": "search", "arguments": {"query": "y"}}\n```\n</tool_call>'
    assert parse_tool_calls(fenced, max_calls=4).calls[0].arguments == {"query": "y"}
    listed = '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": 1}}]</tool_call>'
    assert [c.name for c in parse_tool_calls(listed, max_calls=4).calls] == ["a", "b"]
    # A raw newline inside a JSON string (invalid strict JSON) is accepted.
    raw_nl = '<tool_call>{"name": "python", "arguments": {"code": "print(1)\nprint(2)"}}</tool_call>'
    assert parse_tool_calls(raw_nl, max_calls=4).calls[0].arguments == {"code": "print(1)\nprint(2)"}


def test_unknown_tool_lists_available_names():
    [err] = parse_tool_calls(call("wikipedia", {"q": "x"}), max_calls=4, tools=TOOLS).errors
    assert err.error_kind == "unknown_tool" and err.name == "wikipedia"
    assert err.text == "Error: unknown tool 'wikipedia'. Available tools: calculator, search"


def test_missing_required_argument():
    [err] = parse_tool_calls(call("search", {"top_k": 3}), max_calls=4, tools=TOOLS).errors
    assert err.error_kind == "bad_arguments"
    assert "missing required argument(s) 'query'" in err.text and "query, top_k" in err.text


def test_unclosed_tag():
    parsed = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"query": "x"}}', max_calls=4)
    [err] = parsed.errors
    assert err.error_kind == "parse" and "never closed with </tool_call>" in err.text
    assert has_tool_call('<tool_call>{"name": "search"')


def test_nested_open_tags_answer_the_outer_and_run_the_inner():
    text = '<tool_call>{"name": "a"<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    parsed = parse_tool_calls(text, max_calls=4)
    assert [type(s).__name__ for s in parsed.slots] == ["ToolResult", "ToolCall"]
    assert "was not closed before the next <tool_call>" in parsed.slots[0].text
    assert parsed.calls[0].name == "b"


def test_calls_over_max_calls():
    text = "".join(call("search", {"query": str(i)}) for i in range(5))
    parsed = parse_tool_calls(text, max_calls=2, tools=TOOLS)
    assert [c.arguments["query"] for c in parsed.calls] == ["0", "1"]
    [err] = parsed.errors
    assert err.text == ("Error: only the first 2 calls were run; 3 more were ignored "
                        "(the limit is 2 tool calls per turn)")
    assert parse_tool_calls(text, max_calls=0).calls == []


def test_calls_inside_closed_thinking_are_not_run():
    text = "<think>maybe " + call("search", {"query": "draft"}) + "</think>" + call("search", {"query": "real"})
    assert [c.arguments["query"] for c in parse_tool_calls(text, max_calls=4).calls] == ["real"]
    assert not has_tool_call("<think>" + call("search", {"query": "draft"}) + "</think>done")
    # An unclosed think block may hold the only call: keep it.
    assert parse_tool_calls("<think>" + call("search", {"query": "q"}), max_calls=4).calls


def test_merge_interleaves_results_and_errors_in_written_order():
    text = call("search", {"query": "a"}) + "<tool_call>oops</tool_call>" + call("calculator", {"expression": "2"})
    parsed = parse_tool_calls(text, max_calls=4, tools=TOOLS)
    results = [ToolResult(name="search", text="A"), ToolResult(name="calculator", text="2")]
    merged = parsed.merge(results)
    assert [r.text[:6] for r in merged] == ["A", "Error:", "2"]
    with pytest.raises(ValueError):
        parsed.merge(results[:1])


# ---------------------------------------------------------------- rendering

def test_render_tool_response_matches_the_qwen3_template(repo_root: Path):
    results = [ToolResult(name="search", text="Paris is the capital."),
               ToolResult(name="calculator", text="division by zero", is_error=True)]
    body = render_tool_response(results)
    assert body == ("<tool_response>\nParis is the capital.\n</tool_response>\n"
                    "<tool_response>\nError: division by zero\n</tool_response>")
    template = repo_root / "rlfactory" / "models" / "templates" / "qwen3.jinja"
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, **kw: json.dumps(v, ensure_ascii=False)
    rendered = env.from_string(template.read_text()).render(
        messages=[{"role": "user", "content": "q"}] + tool_messages(results), add_generation_prompt=False,
    )
    assert f"<|im_start|>user\n{body}<|im_end|>\n" in rendered


def test_response_text_marks_errors_once_and_truncates():
    assert response_text(ToolResult(name="t", text="Error: bad", is_error=True)) == "Error: bad"
    assert response_text(ToolResult(name="t", text="bad", is_error=True)) == "Error: bad"
    assert response_text(ToolResult(name="t", text="x" * 50), max_chars=10) == "x" * 10 + (
        "\n[... 40 more characters cut]")
    assert tool_messages([ToolResult(name="t", text="ok")]) == [{"role": "tool", "name": "t", "content": "ok"}]


# ---------------------------------------------------------------- fuzz

FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", "<think>", "</think>", "{", "}", "[", "]",
    '"name"', '"arguments"', ":", ",", '"calculator"', '"search"', "null", "1e999", "-0", '"\\u0000"', '"\\ud800"',
    '{"name": "search", "arguments": {"query": "x"}}', '{"name": 5}', '"arguments": "{\\"a\\": 1}"',
    "```json", "```", "ünï©ødé ✓ 日本語", "\x00", "\ud800", " ", "\n", "<tool_response>",
    "9" * 5000, "[" * 3000,
])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def check_well_typed(parsed: ParsedCalls, max_calls: int, tools=None) -> None:
    assert isinstance(parsed, ParsedCalls)
    assert len(parsed.slots) <= max_calls + 1
    for slot in parsed.slots:
        if isinstance(slot, ToolCall):
            assert isinstance(slot.name, str) and slot.name
            assert isinstance(slot.arguments, dict)
            if tools is not None:
                assert slot.name in tools
        else:
            assert isinstance(slot, ToolResult)
            assert slot.is_error and slot.error_kind in ERROR_KINDS and slot.text.startswith("Error: ")
    render_tool_response(parsed.errors)  # always renderable


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(FRAGMENTS | st.text(max_size=30), max_size=30).map("".join),
       max_calls=st.integers(0, 5), with_tools=st.booleans())
def test_fuzz_fragments_never_raise(text, max_calls, with_tools):
    tools = TOOLS if with_tools else None
    parsed = parse_tool_calls(text, max_calls=max_calls, tools=tools)
    check_well_typed(parsed, max_calls, tools)
    # A turn has slots exactly when it contains a call outside closed thinking (even one over the limit).
    assert has_tool_call(text) == bool(parsed.slots)


@settings(max_examples=1000, deadline=None)
@given(text=st.text(max_size=400), max_calls=st.integers(0, 3))
def test_fuzz_arbitrary_text_never_raises(text, max_calls):
    check_well_typed(parse_tool_calls(text, max_calls=max_calls, tools=TOOLS), max_calls, TOOLS)


@settings(max_examples=500, deadline=None)
@given(body=JSON_VALUES, prefix=st.text(max_size=20), max_calls=st.integers(1, 3))
def test_fuzz_arbitrary_json_bodies(body, prefix, max_calls):
    text = f"{prefix}<tool_call>{json.dumps(body)}</tool_call>"
    check_well_typed(parse_tool_calls(text, max_calls=max_calls), max_calls)


NO_TAGS = st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=["Cs"]), max_size=12)
PLAIN_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | NO_TAGS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NO_TAGS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(calls=st.lists(st.tuples(NO_TAGS.filter(lambda s: s and s.strip() == s),
                                st.dictionaries(NO_TAGS, PLAIN_JSON, max_size=4)), max_size=4),
       between=st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=20))
def test_fuzz_well_formed_calls_round_trip(calls, between):
    text = between.join(call(name, args) for name, args in calls)
    parsed = parse_tool_calls(text, max_calls=10)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        (name, json.loads(json.dumps(args))) for name, args in calls]


def test_pathological_inputs_stay_linear():
    """Inputs that make backtracking regexes quadratic; the parser scans them in one pass (no time assertion:
    the test would hang, and hit the suite's timeout, if it were quadratic)."""
    many_thinks = "<think>" * 20_000 + "<tool_call>{}</tool_call>"
    assert len(parse_tool_calls(many_thinks, max_calls=2).slots) == 1
    fenced = "<tool_call>```" + (" " * 1000 + "x") * 200 + "```</tool_call>"
    [err] = parse_tool_calls(fenced, max_calls=2).errors
    assert err.error_kind == "parse"
    many_calls = "<tool_call>" * 50_000
    parsed = parse_tool_calls(many_calls, max_calls=3)
    assert len(parsed.slots) == 4 and "49997 more were ignored" in parsed.slots[-1].text
