"""AgentLoop with real parts: the offline Qwen3 tokenizer, a tiny Qwen3 (weights set to follow scripts) behind the HF
engine, and the real calculator MCP server through the ToolManager. Plus tool-text truncation by tokens."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_model import build_scripted_qwen3

from rlfactory.data.seeds import mix_seed
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.truncation import truncate_tokens
from rlfactory.tools.manager import ToolManager

IM_END = 151645
CALL = '<tool_call>{"name": "calculator","arguments":{"expression":"6*7"}}</tool_call>'
ANSWER = "The answer is 42.<|im_end|>"


# ---------------------------------------------------------------------------------------------- truncation
@pytest.fixture(scope="module")
def tok(qwen_tokenizer):
    return qwen_tokenizer


def _codec(tok):
    return (lambda s: tok.encode(s, add_special_tokens=False)), (lambda ids: tok.decode(ids))


def test_truncation_boundaries(tok):
    enc, dec = _codec(tok)
    text = " ".join(f"word{i}" for i in range(200))
    n = len(enc(text))
    assert truncate_tokens(text, n, "right", enc, dec) == (text, 0)  # exactly at the limit: untouched
    for side in ("right", "left", "middle"):
        cut, removed = truncate_tokens(text, n - 1, side, enc, dec)  # one over: cut
        assert removed > 0 and cut != text and len(enc(cut)) <= n - 1
        assert "tokens truncated" in cut
    right, _ = truncate_tokens(text, 40, "right", enc, dec)
    left, _ = truncate_tokens(text, 40, "left", enc, dec)
    middle, _ = truncate_tokens(text, 40, "middle", enc, dec)
    assert right.startswith("word0 word1") and not right.rstrip().endswith("word199")
    assert left.rstrip().endswith("word199") and "word0 " not in left
    assert middle.startswith("word0") and middle.rstrip().endswith("word199")
    assert truncate_tokens(text, 0, "right", enc, dec)[0] == ""
    tiny, _ = truncate_tokens(text, 3, "middle", enc, dec)  # no room for the note: a plain cut
    assert len(enc(tiny)) <= 3 and "truncated" not in tiny


def test_a_huge_response_is_tokenized_only_where_it_is_kept(tok):
    """64 KiB of output for a 64-token budget: only windows at the kept ends are tokenized, the kept text is what
    tokenizing the whole would keep, and the note says the count of tokens cut is an estimate."""
    enc, dec = _codec(tok)
    seen: list[int] = []

    def counting(s: str) -> list[int]:
        seen.append(len(s))
        return enc(s)

    text = " ".join(f"w{i}" for i in range(20_000))
    for side in ("right", "left", "middle"):
        seen.clear()
        cut, removed = truncate_tokens(text, 64, side, counting, dec)
        assert max(seen) < len(text) // 10 and len(enc(cut)) <= 64 and "about" in cut
        exact_total = len(enc(text))
        assert abs(removed - (exact_total - 64)) < 0.1 * exact_total  # an estimate, and a close one
        if side == "right":
            assert cut.startswith("w0 w1 w2") and cut.split("\n[")[0] in text
        if side == "left":
            assert cut.rstrip().endswith("w19999")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120),
       limit=st.integers(0, 40), side=st.sampled_from(["left", "right", "middle"]))
def test_truncation_never_exceeds_the_budget(tok, text, limit, side):
    enc, dec = _codec(tok)
    cut, removed = truncate_tokens(text, limit, side, enc, dec)
    assert len(enc(cut)) <= limit
    assert (removed == 0) == (len(enc(text)) <= limit)
    if removed == 0:
        assert cut == text


# ---------------------------------------------------------------------------------------------- the loop
def _calculator_config(tmp_path: Path, repo_root: Path) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"calculator": {
        "command": "python", "args": [str(repo_root / "envs" / "tools" / "calculator.py")]}}}))
    return path


def _engine(tok, chat, scripts, junk_prob=0.001):
    model = build_scripted_qwen3(tok, scripts, start_token_ids=[chat.generation_prompt_ids[-1]], junk_prob=junk_prob)
    return HFEngine(model, pad_token_id=151643, eos_token_ids=[IM_END], max_batch_size=32)


def _cfg(**kw):
    base = dict(max_context_tokens=2048, max_response_tokens=1024, tool_response_max_tokens=64,
                sampling={"temperature": 0.0, "max_new_tokens_per_turn": 40})
    base.update(kw)
    return RolloutConfig(**base)


def _check_invariants(t, cfg):
    assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)
    pos = 0
    for span in t.turns:
        assert span.start == pos and span.end > span.start
        want = 1 if span.role == "assistant" else 0
        assert set(t.loss_mask[span.start:span.end]) == {want}
        pos = span.end
    assert pos == len(t.response_ids)
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if m == 0)
    assert len(t.prompt_ids) + len(t.response_ids) <= cfg.max_context_tokens
    assert len(t.response_ids) <= cfg.max_response_tokens


async def test_calls_run_through_real_tools_until_the_horizon(tok, tmp_path, repo_root):
    async with ToolManager.from_files([_calculator_config(tmp_path, repo_root)]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        engine = _engine(tok, chat, [(CALL + "<|im_end|>", 1.0)])
        cfg = _cfg()
        loop = AgentLoop(engine, tools, chat, cfg)
        try:
            trajs, metrics = await loop.run_batch([{"prompt": "What is 6*7?", "id": "q1", "answer": "42"}],
                                                  samples_per_prompt=2, horizon=3, seed=7)
        finally:
            await engine.close()
    assert [t.sample_index for t in trajs] == [0, 1] and trajs[0].group_id == trajs[1].group_id
    t = trajs[0]
    _check_invariants(t, cfg)
    assert t.finish_reason == "max_turns" and t.num_turns == 3 and t.horizon == 3
    assert [s.role for s in t.turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert t.turns[0].text == CALL  # the closing <|im_end|> is a policy token but not part of the turn's text
    assert t.response_ids[t.turns[0].end - 1] == IM_END
    assert "<tool_response>\n42\n</tool_response>" in t.turns[1].text
    assert [(c.turn, c.name, c.arguments, c.result, c.is_error) for c in t.tool_calls] == [
        (0, "calculator", {"expression": "6*7"}, "42", False), (1, "calculator", {"expression": "6*7"}, "42", False)]
    roles = [m["role"] for m in t.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert t.task["answer"] == "42" and t.task_id == "q1"
    assert set(t.timings) == {"generate_s", "tools_s", "total_s"} and t.timings["tools_s"] > 0
    assert metrics["rollout/finish_max_turns"] == 2 and metrics["rollout/num_turns_mean"] == 3
    assert metrics["rollout/tool_calls"] == 4 and metrics["tools/calls"] == 4
    assert metrics["tools/calculator/calls"] == 4


async def test_limits_and_finish_reasons(tok, tmp_path, repo_root):
    async with ToolManager.from_files([_calculator_config(tmp_path, repo_root)]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        three_calls = _engine(tok, chat, [(CALL * 3 + "<|im_end|>", 1.0)])
        answer = _engine(tok, chat, [(ANSWER, 1.0)])
        task = {"prompt": "What is 6*7?", "id": 1}
        prompt_len = len(chat.prompt_ids(chat.prompt_messages(task["prompt"])))
        try:
            # max tool calls per turn: two run, the third is answered with an error the model can read
            cfg = _cfg(max_tool_calls_per_turn=2, sampling={"temperature": 0.0, "max_new_tokens_per_turn": 80})
            t = await AgentLoop(three_calls, tools, chat, cfg).run_one(task, horizon=2)
            _check_invariants(t, cfg)
            assert [c.is_error for c in t.tool_calls] == [False, False, True]
            assert "2 tool calls per turn" in t.tool_calls[2].result
            assert t.turns[1].text.count("<tool_response>") == 3

            # a final answer: stop after one turn
            t = await AgentLoop(answer, tools, chat, _cfg()).run_one(task, horizon=4)
            assert t.finish_reason == "stop" and t.num_turns == 1 and t.turns[0].text == "The answer is 42."

            # context guard: the first turn fits exactly, the tool turn would not
            cfg = _cfg(max_context_tokens=prompt_len + 16, max_response_tokens=15)
            t = await AgentLoop(three_calls, tools, chat, cfg).run_one(task, horizon=4)
            _check_invariants(t, cfg)
            assert t.finish_reason in ("context_length", "token_budget") and t.num_turns == 1
            cfg = _cfg(max_context_tokens=prompt_len + 20, max_response_tokens=1000)
            t = await AgentLoop(three_calls, tools, chat, cfg).run_one(task, horizon=4)
            _check_invariants(t, cfg)
            assert t.finish_reason == "context_length"
            assert len(t.prompt_ids) + len(t.response_ids) == prompt_len + 20  # used to the last token, not past

            # the response budget, cut mid-call: the unclosed call is answered, then the budget ends it
            cfg = _cfg(max_response_tokens=150, sampling={"temperature": 0.0, "max_new_tokens_per_turn": 10})
            t = await AgentLoop(three_calls, tools, chat, cfg).run_one(task, horizon=10)
            _check_invariants(t, cfg)
            assert t.finish_reason == "token_budget"
            assert t.tool_calls and t.tool_calls[0].error_kind == "parse"
            # the cut turn was closed by a template <|im_end|> with mask 0
            first_tool = t.turns[1]
            assert t.response_ids[first_tool.start] == IM_END and t.loss_mask[first_tool.start] == 0

            # no tools configured: calls are answered with errors, nothing raises
            t = await AgentLoop(three_calls, None, chat, _cfg()).run_one(task, horizon=2)
            assert t.finish_reason == "max_turns" and all(c.is_error for c in t.tool_calls)
        finally:
            await three_calls.close()
            await answer.close()


async def test_stop_at_tool_call_end_and_errors_are_recorded(tok, tmp_path, repo_root):
    async with ToolManager.from_files([_calculator_config(tmp_path, repo_root)]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False, stop_at_tool_call_end=True)
        engine = _engine(tok, chat, [(CALL + "<|im_end|>", 1.0)])
        cfg = _cfg()
        loop = AgentLoop(engine, tools, chat, cfg)
        try:
            trajs, metrics = await loop.run_batch(
                [{"prompt": "What is 6*7?"}, {"prompt": 12345}, {"prompt": [{"role": "user", "content": "6*7?"}]}],
                samples_per_prompt=1, horizon=2, seed=0)
        finally:
            await engine.close()
    ok, bad, listed = trajs
    # generation stopped at </tool_call>: the template's <|im_end|> (mask 0) closes the turn
    assert ok.response_ids[ok.turns[0].end - 1] == 151658
    assert ok.response_ids[ok.turns[1].start] == IM_END and ok.loss_mask[ok.turns[1].start] == 0
    assert ok.tool_calls[0].result == "42"
    _check_invariants(ok, cfg)
    assert bad.finish_reason == "error" and "prompt" in bad.error and bad.response_ids == []
    assert listed.finish_reason == "max_turns"
    assert metrics["rollout/errors"] == 1 and metrics["rollout/finish_error"] == 1


async def test_sampling_is_reproducible_per_seed(tok):
    chat = ChatFormat(tok, [], enable_thinking=False)
    engine = _engine(tok, chat, [(CALL + "<|im_end|>", 1.0), (ANSWER, 1.0)], junk_prob=0.2)
    cfg = _cfg(sampling={"temperature": 1.0, "max_new_tokens_per_turn": 24})
    loop = AgentLoop(engine, None, chat, cfg)
    tasks = [{"prompt": "q", "id": i} for i in range(3)]
    try:
        a, _ = await loop.run_batch(tasks, samples_per_prompt=2, horizon=2, seed=11)
        b, _ = await loop.run_batch(tasks, samples_per_prompt=2, horizon=2, seed=11)
        c, _ = await loop.run_batch(tasks, samples_per_prompt=2, horizon=2, seed=12)
    finally:
        await engine.close()
    assert [t.response_ids for t in a] == [t.response_ids for t in b]
    assert [t.response_ids for t in a] != [t.response_ids for t in c]
    assert len({tuple(t.response_ids) for t in a}) > 1  # samples of one group differ
    assert mix_seed(1, 2) != mix_seed(2, 1) and 0 <= mix_seed(5) < 2**63


async def test_error_text_keeps_its_own_budget(tok, tmp_path, repo_root):
    bad = '<tool_call>{"name": "calculator","arguments":{"expr":"6*7"}}</tool_call><|im_end|>'
    async with ToolManager.from_files([_calculator_config(tmp_path, repo_root)]) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        engine = _engine(tok, chat, [(bad, 1.0)])
        task = {"prompt": "What is 6*7?", "id": 1}
        try:
            # tool responses cut to 4 tokens, but the error is read whole (64 tokens by default)
            t = await AgentLoop(engine, tools, chat, _cfg(tool_response_max_tokens=4)).run_one(task, horizon=2)
            short = await AgentLoop(engine, tools, chat, _cfg(tool_response_max_tokens=4, tool_error_max_tokens=4)
                                    ).run_one(task, horizon=2)
        finally:
            await engine.close()
    err = t.tool_calls[0]
    assert err.is_error and err.error_kind == "bad_arguments" and not err.infra
    assert "missing required argument(s) 'expression'" in err.result and "truncated" not in err.result
    assert 4 < len(tok.encode(err.result, add_special_tokens=False)) <= 64
    cut = short.tool_calls[0].result  # an error budget of 4 tokens cuts it, as before
    assert len(tok.encode(cut, add_special_tokens=False)) <= 4 and "expression" not in cut
    assert not t.infra_failed  # the model's own mistake is feedback, not an infrastructure failure
