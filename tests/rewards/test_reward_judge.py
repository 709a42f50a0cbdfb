"""rewards/judge.py: score parsing, and the LLM judge over real HTTP — against `rlfactory serve` (a tiny random
model: junk replies, so retries, timeouts, forced choices and caching are what is tested) and against a fixed-reply
server written here (deterministic replies, so parsing, 5xx retries and the concurrency limit are checked)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlfactory.recipe.rewards import RewardsConfig, RewardSpec
from rlfactory.recipe.tools import CacheConfig
from rlfactory.reward import RewardSet
from rlfactory.rewards.judge import JudgeError, build_messages, llm_judge, parse_score
from rlfactory.tools.cache.factory import make_cache

SCORES = [str(i) for i in range(11)]
TASK = {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 6*7?"}],
        "answer": "42"}


@pytest.mark.parametrize("reply,expected", [
    ("Score: 7/10", 0.7), ("The answer is right.\nScore: 10", 1.0), ("score = 3 / 4", 0.75),
    ("**Score:** 8", 0.8), ('Verdict below.\n```json\n{"score": 6, "reason": "ok"}\n```', 0.6),
    ('{"verdict": "correct"}', 1.0), ('{"correct": false}', 0.0), ('{"score": 1, "max_score": 1}', 1.0),
    ("7", 0.7), ("  9/10. ", 0.9), ("Score: 2/10 ... on reflection Score: 4/10", 0.4),
    ("<think>Score: 1</think>Score: 9", 0.9), ("Score: ٧", 0.7), ("", None), ("junk", None),
    ("Score: 11/10", None), ("Score: -1", None), ('{"score": "high"}', None), ("The score is seven", None),
])
def test_parse_score(reply, expected):
    got = parse_score(reply, max_score=10)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_prompt_template_fills_only_its_placeholders():
    msgs = build_messages('Q: {question}\nA: {answer}\nR: {response}\nReply as {"score": N}', "q?", 42, "r",
                          system_prompt=None)
    assert msgs == [{"role": "user", "content": 'Q: q?\nA: 42\nR: r\nReply as {"score": N}'}]


# --------------------------------------------------------------------------- against `rlfactory serve`
async def test_junk_replies_are_retried_then_raise(served_model):
    before = served_model.health()["requests"]
    with pytest.raises(JudgeError, match=r"after 3 attempts: no score in the reply"):
        await llm_judge("42", TASK, "42", base_url=served_model.base_url, model="tiny-random", max_tokens=8,
                        retries=2, backoff_s=0.01)
    assert served_model.health()["requests"] - before == 3


async def test_timeouts_are_retried_then_raise_and_the_server_stops_generating(served_model):
    # 4,000 tokens take this server about 20 s, so a 1 s timeout always fires first, and 1 s is ample for each
    # request to reach the server however loaded the machine is (the count is awaited, not sampled).
    before = served_model.health()
    with pytest.raises(JudgeError, match="after 2 attempts: timed out"):
        await llm_judge("42", TASK, "42", base_url=served_model.base_url, model="tiny-random", max_tokens=4000,
                        temperature=1.0, timeout_s=1.0, retries=1, backoff_s=0.01)
    deadline = time.monotonic() + 60
    while served_model.health()["requests"] - before["requests"] < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert served_model.health()["requests"] - before["requests"] == 2
    # serve cancels a generation whose client hung up: wait until the engine is idle, then count tokens
    previous, now = -1, served_model.health()["engine"]["generated_tokens"]
    while now != previous:
        await asyncio.sleep(1.0)
        previous, now = now, served_model.health()["engine"]["generated_tokens"]
    assert now - before["engine"]["generated_tokens"] < 4000  # two abandoned requests, not 2 x 4,000 tokens


async def test_forced_choice_scores_and_second_call_is_a_cache_hit(served_model, redis_server, tmp_path):
    cache = make_cache(CacheConfig(backend="redis", url=redis_server.url), tmp_path / "unused.rdb")
    kwargs = dict(base_url=served_model.base_url, model="tiny-random", extra_body={"guided_choice": SCORES},
                  retries=0)
    try:
        before = served_model.health()["requests"]
        first = await llm_judge("42", TASK, "42", cache, **kwargs)
        assert served_model.health()["requests"] - before == 1
        assert first in {i / 10 for i in range(11)}
        second = await llm_judge("42", TASK, "42", cache, **kwargs)
        assert second == first
        assert served_model.health()["requests"] - before == 1  # answered from Redis, not the server
        assert cache.stats.hits == 1
        # a different response is a different judgment
        await llm_judge("41", TASK, "42", cache, **kwargs)
        assert served_model.health()["requests"] - before == 2
    finally:
        await cache.close()


async def test_judge_in_a_reward_set_with_the_shared_cache(served_model, redis_server, tmp_path, make_traj):
    cache = make_cache(CacheConfig(backend="redis", url=redis_server.url), tmp_path / "unused.rdb")
    cfg = RewardsConfig(functions=[
        RewardSpec(function="llm_judge", kwargs={"base_url": served_model.base_url, "model": "tiny-random",
                                                 "extra_body": {"guided_choice": SCORES}, "retries": 0}),
        RewardSpec(function="llm_judge", name="junk_judge", weight=0,
                   kwargs={"base_url": served_model.base_url, "model": "tiny-random", "max_tokens": 4,
                           "retries": 0}),
    ], failure_value=-1.0)
    try:
        rs = RewardSet.from_config(cfg, Path("."), cache=cache)
        trajs = [make_traj([f"<answer>{i}</answer>"], answer="42", tid=f"t{i}") for i in range(3)]
        metrics = await rs.score(trajs)
        # the junk judge fails on every sample: counted, flagged, failure value — never a silent 0
        assert metrics["reward/errors"] == 3.0 and all(t.reward_failed and t.reward == -1.0 for t in trajs)
        assert all(0.0 <= t.reward_components["llm_judge"] <= 1.0 for t in trajs)
        hits = cache.stats.hits
        await rs.score(trajs)
        assert cache.stats.hits - hits == 3  # every verdict of the first pass was reused
    finally:
        await cache.close()


# --------------------------------------------------------------------------- against a fixed-reply server
class FixedReplies:
    """An OpenAI-shaped HTTP server on 127.0.0.1 that answers from a script: (status, content, delay_s)."""

    def __init__(self, script):
        self.script = list(script)
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.bodies.append(body)
                    status, content, delay_s = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                time.sleep(delay_s)
                with outer.lock:
                    outer.in_flight -= 1
                payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                                           "content": content}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fixed_replies():
    servers = []

    def start(*script):
        servers.append(FixedReplies(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


async def test_request_carries_template_model_and_sampling(fixed_replies, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sekret")
    server = fixed_replies((200, "Reasoning...\nScore: 8/10", 0))
    score = await llm_judge("<think>hmm</think>It is 42.", TASK, "42", base_url=server.base_url, model="judge-1",
                            temperature=0.3, max_tokens=50, api_key_env="JUDGE_KEY")
    assert score == pytest.approx(0.8)
    [body] = server.bodies
    assert body["model"] == "judge-1" and body["temperature"] == 0.3 and body["max_tokens"] == 50
    user = body["messages"][-1]["content"]
    assert "What is 6*7?" in user and "Reference answer:\n42" in user and "It is 42." in user
    assert "hmm" not in user  # the policy's thinking is not shown to the judge


async def test_server_errors_and_unparseable_replies_are_retried(fixed_replies):
    server = fixed_replies((503, "", 0), (200, "no idea", 0), (200, '{"score": 9}', 0))
    assert await llm_judge("x", TASK, "42", base_url=server.base_url, model="m", retries=2, backoff_s=0.01) == 0.9
    assert len(server.bodies) == 3


async def test_client_errors_are_not_retried(fixed_replies):
    server = fixed_replies((401, "", 0))
    with pytest.raises(JudgeError, match="HTTP 401"):
        await llm_judge("x", TASK, "42", base_url=server.base_url, model="m", retries=3, backoff_s=0.01)
    assert len(server.bodies) == 1


async def test_concurrency_limit_per_endpoint(fixed_replies):
    server = fixed_replies((200, "Score: 5", 0.05))
    scores = await asyncio.gather(*(llm_judge(f"r{i}", TASK, "42", base_url=server.base_url, model="m",
                                              concurrency=2) for i in range(8)))
    assert scores == [0.5] * 8
    assert server.max_in_flight == 2


async def test_embedded_cache_keeps_verdicts(fixed_replies, tmp_path):
    server = fixed_replies((200, "Score: 3", 0))
    cache = make_cache(CacheConfig(backend="embedded"), tmp_path / "judge.rdb")
    try:
        for _ in range(3):
            assert await llm_judge("x", TASK, "42", cache, base_url=server.base_url, model="m") == 0.3
        assert len(server.bodies) == 1 and cache.stats.hits == 2
    finally:
        await cache.close()
