"""`rlfactory serve` as an OpenAI-compatible server: routes, tools, tool-call parsing, sampling fields, streaming,
batching, errors — over real HTTP against a real subprocess serving a tiny random Qwen3."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rlfactory.serve.server import split_reply

CALC_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def _chat(server, **body) -> httpx.Response:
    body.setdefault("model", "tiny-random")
    body.setdefault("messages", [{"role": "user", "content": "What is 6*7?"}])
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


def test_models_and_health(served_model):
    models = httpx.get(f"{served_model.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-random"]
    health = served_model.health()
    assert health["status"] == "ok" and health["model"] == "tiny-random"


def test_completion_shape_and_tools_are_rendered(served_model):
    plain = _chat(served_model, max_tokens=4, temperature=0).json()
    with_tools = _chat(served_model, max_tokens=4, temperature=0, tools=[CALC_TOOL]).json()
    choice = plain["choices"][0]
    assert plain["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("stop", "length")
    assert plain["usage"]["completion_tokens"] <= 4
    # the tool schema (and Qwen3's tool instructions) went into the system turn of the prompt
    assert with_tools["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 50


def test_tool_calls_are_parsed_into_openai_tool_calls(served_model):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    r = _chat(served_model, tools=[CALC_TOOL], temperature=0, guided_choice=[call]).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [tc] = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "calculator"
    assert json.loads(tc["function"]["arguments"]) == {"expression": "6*7"}
    # the assistant turn with the call and the tool's answer render back through the template
    follow = _chat(served_model, tools=[CALC_TOOL], max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": "What is 6*7?"}, choice["message"],
        {"role": "tool", "tool_call_id": tc["id"], "content": "42"}])
    assert follow.status_code == 200, follow.text


def test_split_reply_separates_thinking_content_and_calls():
    reasoning, content, calls = split_reply(
        '<think>\nadd them\n</think>\n\nLet me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n'
        '</tool_call>\n<tool_call>\n{"name": "calc", "arguments": "{\\"x\\": 2}"}\n</tool_call>')
    assert reasoning == "add them" and content == "Let me compute."
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"x": 1}, {"x": 2}]
    assert split_reply("<tool_call>{broken</tool_call>") == (None, "<tool_call>{broken</tool_call>", [])


def test_openai_client_seed_n_and_stop(served_model):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served_model.base_url, api_key="unused", timeout=120)
    msgs = [{"role": "user", "content": "Say something."}]
    a = client.chat.completions.create(model="tiny-random", messages=msgs, n=2, seed=7, temperature=1.0,
                                       top_p=0.9, max_tokens=12)
    b = client.chat.completions.create(model="tiny-random", messages=msgs, n=2, seed=7, temperature=1.0,
                                       top_p=0.9, max_tokens=12)
    texts = [c.message.content for c in a.choices]
    assert len(texts) == 2 and texts == [c.message.content for c in b.choices]  # same seed, same samples
    assert texts[0] != texts[1]  # choice i uses seed + i
    text = texts[0]
    # a 2-character stop string from the middle of the reply (visible characters, no undecodable bytes)
    stop = next((text[i:i + 2] for i in range(len(text) // 2, len(text) - 1)
                 if text[i:i + 2].strip() and "\ufffd" not in text[i:i + 2]), None)
    assert stop, f"no usable stop string in the reply {text!r}"
    c = client.chat.completions.create(model="tiny-random", messages=msgs, seed=7, temperature=1.0, top_p=0.9,
                                       max_tokens=12, stop=[stop])
    assert c.choices[0].message.content == text[: text.index(stop)]
    assert c.choices[0].finish_reason == "stop"


def test_streaming_sends_one_chunk_then_done(served_model):
    with httpx.stream("POST", f"{served_model.base_url}/chat/completions", timeout=60, json={
            "model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_concurrent_choices_are_batched_in_the_engine(served_model):
    before = served_model.health()["engine"]
    r = _chat(served_model, n=4, max_tokens=6, temperature=1.0, seed=1)
    assert len(r.json()["choices"]) == 4
    after = served_model.health()["engine"]
    assert after["requests"] - before["requests"] == 4
    assert after["prefill_batches"] - before["prefill_batches"] < 4  # admitted together, not one by one


async def test_concurrent_requests_all_answered(served_model):
    async with httpx.AsyncClient(timeout=120) as client:
        body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        rs = await asyncio.gather(*(client.post(f"{served_model.base_url}/chat/completions",
                                                json={**body, "seed": i}) for i in range(6)))
    assert all(r.status_code == 200 for r in rs)


def test_errors_are_openai_shaped(served_model):
    wrong = _chat(served_model, model="gpt-4o")
    assert wrong.status_code == 404 and "serves 'tiny-random'" in wrong.json()["error"]["message"]
    unsupported = _chat(served_model, logprobs=True)
    assert unsupported.status_code == 400 and "logprobs" in unsupported.json()["error"]["message"]
    empty = _chat(served_model, messages=[])
    assert empty.status_code == 400 and empty.json()["error"]["type"] == "invalid_request_error"


def test_forced_choice_picks_the_highest_logprob_choice():
    torch = pytest.importorskip("torch")
    from rlfactory.models.tiny import build_tiny_qwen3
    from rlfactory.models.tokenizer import QWEN3_MODEL_VOCAB_SIZE, load_qwen_tokenizer
    from rlfactory.serve.server import ChatServer

    tok = load_qwen_tokenizer()
    server = ChatServer(build_tiny_qwen3(QWEN3_MODEL_VOCAB_SIZE, seed=3), tok, "m")
    prompt = tok.apply_chat_template([{"role": "user", "content": "Grade it."}], add_generation_prompt=True,
                                     tokenize=False)
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    choices = ["0", "5", "10", "yes", "no way"]

    def total_logprob(choice: str) -> float:  # the slow, obvious computation: one full forward per choice
        ids = prompt_ids + tok.encode(choice, add_special_tokens=False) + [server.eos_ids[0]]
        with torch.no_grad():
            logp = torch.log_softmax(server.model(torch.tensor([ids])).logits[0].float(), -1)
        return sum(logp[t - 1, ids[t]].item() for t in range(len(prompt_ids), len(ids)))

    expected = max(choices, key=total_logprob)
    [(picked, tokens)] = server.choose(prompt_ids, choices, 0.0, [None])
    assert picked == expected and tokens == len(tok.encode(expected, add_special_tokens=False))
    sampled = {c for c, _ in server.choose(prompt_ids, choices, 1.0, list(range(5)))}
    assert sampled <= set(choices)


async def test_serving_a_saved_model_directory(tmp_path):
    """The MODEL-dir path: a checkpoint saved with save_pretrained (weights + tokenizer) loads and answers."""
    from rlfactory.models.tiny import build_tiny_qwen3
    from rlfactory.models.tokenizer import QWEN3_MODEL_VOCAB_SIZE, load_qwen_tokenizer
    from rlfactory.serve.server import ChatRequest, load_server

    build_tiny_qwen3(QWEN3_MODEL_VOCAB_SIZE, seed=1).save_pretrained(tmp_path / "ckpt")
    load_qwen_tokenizer().save_pretrained(tmp_path / "ckpt")
    server = load_server(str(tmp_path / "ckpt"))
    try:
        assert server.model_name == "ckpt"
        reply = await server.complete(ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                                  temperature=0, tools=[CALC_TOOL]))
        assert reply["model"] == "ckpt" and 1 <= reply["usage"]["completion_tokens"] <= 3
    finally:
        await server.engine.close()


def test_cli_reports_a_bad_model_without_a_traceback(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "rlfactory.cli", "serve", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "is not a directory" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "rlfactory.cli", "serve"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--tiny-random" in r.stderr
