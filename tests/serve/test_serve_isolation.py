"""`rlfactory serve` under abusive requests: a request's bad template kwargs, forced choices, size or seed fail that
request alone, with a JSON error naming the field, while ordinary requests in flight are answered — over real HTTP
against the served tiny random Qwen3, and in-process against the real tiny model for the engine and choice scoring."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

ORDINARY = {"model": "tiny-random", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 24,
            "temperature": 1.0}


def _url(server) -> str:
    return f"{server.base_url}/chat/completions"


def _message(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    return r.json()["error"]["message"]


async def test_bad_template_kwargs_fail_that_request_alone(served_model):
    bad = {**ORDINARY, "chat_template_kwargs": {"return_tensors": "pt"}}
    async with httpx.AsyncClient(timeout=120) as client:
        ordinary = [asyncio.ensure_future(client.post(_url(served_model), json={**ORDINARY, "seed": i}))
                    for i in range(3)]
        await asyncio.sleep(0.05)  # the ordinary ones are being decoded when the bad one arrives
        refused = await client.post(_url(served_model), json=bad)
        answered = await asyncio.gather(*ordinary)
        assert [r.status_code for r in answered] == [200, 200, 200], [r.text[:200] for r in answered]
        assert refused.status_code == 400
        assert "'return_tensors'" in _message(refused) and "enable_thinking" in _message(refused)
        for key in ("tokenize", "add_generation_prompt", "chat_template", "messages", "padding"):
            r = await client.post(_url(served_model), json={**ORDINARY, "chat_template_kwargs": {key: False}})
            assert r.status_code == 400 and repr(key) in _message(r), (key, r.text[:300])
        # the template's own input still works, and changes the prompt (an empty think block is pre-filled)
        plain = await client.post(_url(served_model), json={**ORDINARY, "max_tokens": 1})
        no_think = await client.post(_url(served_model), json={
            **ORDINARY, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": False}})
    assert plain.status_code == no_think.status_code == 200
    assert no_think.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]


async def test_engine_refuses_a_bad_prompt_and_its_batch_carries_on(tiny_qwen3, qwen_tokenizer):
    """A prompt the model cannot embed fails its own `generate` call, never the batch's step."""
    from rlfactory.rollout.engines.hf import HFEngine
    from rlfactory.rollout.engines.protocol import SamplingParams

    engine = HFEngine(tiny_qwen3, pad_token_id=qwen_tokenizer.pad_token_id, eos_token_ids=[151645],
                      batch_wait_ms=50)
    prompt = qwen_tokenizer.encode("hello there", add_special_tokens=False)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)
    try:
        good = [asyncio.ensure_future(engine.generate(prompt, sampling)) for _ in range(3)]
        bad = [asyncio.ensure_future(engine.generate(p, sampling)) for p in (
            [torch.tensor(prompt)], prompt + [len(qwen_tokenizer) + 10], [-1] + prompt)]
        outs = await asyncio.gather(*good, *bad, return_exceptions=True)
    finally:
        await engine.close()
    assert all(len(o.token_ids) > 0 for o in outs[:3]), outs[:3]
    assert all(isinstance(o, ValueError) for o in outs[3:]), outs[3:]
    assert "flat sequence of integer token ids" in str(outs[3]) and "outside the model's vocabulary" in str(outs[4])


async def test_forced_choices_are_bounded(served_model):
    async with httpx.AsyncClient(timeout=120) as client:
        many = await client.post(_url(served_model), json={**ORDINARY, "guided_choice": [str(i) for i in range(65)]})
        assert many.status_code == 400 and "65 choices" in _message(many) and "at most 64" in _message(many)
        long = await client.post(_url(served_model), json={**ORDINARY, "guided_choice": ["yes", "word " * 200]})
        assert long.status_code == 400 and "choice 1" in _message(long) and "at most 128 tokens" in _message(long)
        huge = await client.post(_url(served_model), json={**ORDINARY, "structured_outputs": {
            "choice": ["no", "word " * 200_000]}})
        assert huge.status_code == 400 and "choice 1" in _message(huge)
        shape = await client.post(_url(served_model), json={**ORDINARY, "structured_outputs": {"choice": "abc"}})
        assert shape.status_code == 400 and "structured_outputs.choice" in _message(shape)
        choices = [f"label {i} " + "yes " * 100 for i in range(64)]  # at both limits: 64 choices of ~100 tokens
        r = await client.post(_url(served_model), json={**ORDINARY, "temperature": 0, "guided_choice": choices})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in choices


def _reference_logprob(model, prompt_ids: list[int], seq: list[int]) -> float:
    """The slow, obvious computation: one full forward over prompt + choice."""
    ids = prompt_ids + seq
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(logp[t - 1, ids[t]].item() for t in range(len(prompt_ids), len(ids)))


@pytest.mark.parametrize("reuse_prompt", [True, False])
def test_choice_scores_match_full_forwards_with_logits_that_do_not_grow_with_choices(
        tiny_qwen3, qwen_tokenizer, monkeypatch, reuse_prompt):
    from rlfactory.serve import choices as scoring
    from rlfactory.serve.server import ChatServer

    if not reuse_prompt:  # the path for caches that cannot be cut back (the prompt runs again per choice)
        monkeypatch.setattr(scoring, "_croppable", lambda cache: False)
    server = ChatServer(tiny_qwen3, qwen_tokenizer, "m")
    prompt = qwen_tokenizer.apply_chat_template([{"role": "user", "content": "Grade it."}],
                                                add_generation_prompt=True, tokenize=False)
    prompt_ids = qwen_tokenizer.encode(prompt, add_special_tokens=False)
    choices = ["0", "5", "10", "yes", "no way", "a longer answer " * 12]  # the last spans several pieces
    seqs = scoring.encode_choices(qwen_tokenizer, choices, server.eos_ids[0], max_tokens=128)
    assert len(seqs[-1]) > 2 * scoring.PIECE_TOKENS
    reference = [_reference_logprob(tiny_qwen3, prompt_ids, s) for s in seqs]

    widest = []  # elements of each LM-head output: the logits held at once
    hook = tiny_qwen3.lm_head.register_forward_hook(lambda _m, _i, out: widest.append(out.numel()))
    try:
        scores = scoring.choice_logprobs(tiny_qwen3, prompt_ids, seqs)
        few = max(widest)
        widest.clear()
        scoring.choice_logprobs(tiny_qwen3, prompt_ids, seqs * 10)  # 60 choices
        many = max(widest)
    finally:
        hook.remove()
    assert scores == pytest.approx(reference, rel=1e-4, abs=1e-3)
    vocab = tiny_qwen3.config.vocab_size
    assert few == many <= scoring.PIECE_TOKENS * vocab  # not choices x length x vocabulary

    # the picks are those of the reference scores: argmax at temperature 0, seeded samples otherwise
    best = max(range(len(choices)), key=reference.__getitem__)
    assert server.choose(prompt_ids, choices, 0.0, [None]) == [(choices[best], len(seqs[best]) - 1)]
    sampled = [c for c, _ in server.choose(prompt_ids, choices, 1.0, list(range(8)))]
    assert sampled == [scoring.pick(choices, reference, 1.0, s) for s in range(8)]


async def test_oversize_bodies_get_413_unread(served_model):
    body = json.dumps({**ORDINARY, "messages": [{"role": "user", "content": "w" * (9 * 2**20)}]}).encode()

    def chunked():  # no Content-Length: the server counts as it reads
        for i in range(0, len(body), 2**16):
            yield body[i:i + 2**16]

    async def chunked_async():
        for piece in chunked():
            yield piece

    async with httpx.AsyncClient(timeout=120) as client:
        sized = await client.post(_url(served_model), content=body, headers={"content-type": "application/json"})
        streamed = await client.post(_url(served_model), content=chunked_async(),
                                     headers={"content-type": "application/json"})
        after = await client.post(_url(served_model), json={**ORDINARY, "max_tokens": 2})
    assert sized.status_code == 413 and "--max-body-mb" in _message(sized) and f"{len(body):,}" in _message(sized)
    assert streamed.status_code == 413 and "at most 8,388,608 bytes" in _message(streamed)
    assert after.status_code == 200


async def test_health_answers_while_a_big_request_is_prepared(served_model):
    """Rendering a ~7 MB conversation (160,000 turns) takes seconds; /health must answer during it."""
    turns = [{"role": ("user", "assistant")[i % 2], "content": "x"} for i in range(160_000)]
    big = {**ORDINARY, "messages": turns}
    seen_in_flight = 0
    async with httpx.AsyncClient(timeout=300) as client:
        task = asyncio.ensure_future(client.post(_url(served_model), json=big))
        while not task.done():
            health = (await client.get(f"http://127.0.0.1:{served_model.port}/health")).json()
            if not task.done() and health["in_flight"] >= 1:
                seen_in_flight += 1
            await asyncio.sleep(0.02)
        r = await task
    assert r.status_code == 400 and "context is 4096" in _message(r)
    assert seen_in_flight >= 1  # a /health reply came while the big request was being answered


async def test_out_of_range_seeds_are_json_400s(served_model):
    async with httpx.AsyncClient(timeout=120) as client:
        for seed in (2**63, 2**64, 2**80, -1):
            r = await client.post(_url(served_model), json={**ORDINARY, "max_tokens": 2, "seed": seed})
            assert r.status_code == 400 and "seed" in _message(r), (seed, r.text[:200])
        top = await client.post(_url(served_model), json={**ORDINARY, "max_tokens": 2, "n": 3, "seed": 2**63 - 1})
        for body in (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', b'{"messages": [',
                     b"[" * 100_000, b"\xff\xfe"):
            r = await client.post(_url(served_model), content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (body[:40], r.text[:200])
            _message(r)
    assert top.status_code == 200 and len(top.json()["choices"]) == 3


async def test_an_unexpected_error_is_a_json_500_for_that_request_only(tiny_qwen3, qwen_tokenizer):
    """With its engine closed under it, the server answers generation requests with a JSON 500 naming the error, and
    still answers everything that does not need the engine."""
    from rlfactory.serve.server import ChatServer, build_app

    server = ChatServer(tiny_qwen3, qwen_tokenizer, "m", default_max_tokens=4)
    await server.engine.close()
    transport = httpx.ASGITransport(app=build_app(server))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=120) as client:
            ordinary = {**ORDINARY, "model": "m"}
            failed, forced, health = await asyncio.gather(
                client.post("/v1/chat/completions", json=ordinary),
                client.post("/v1/chat/completions", json={**ordinary, "guided_choice": ["yes", "no"]}),
                client.get("/health"))
    finally:
        await server.close()
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert "HFEngine.generate called after close()" in failed.json()["error"]["message"]
    assert forced.status_code == 200 and forced.json()["choices"][0]["message"]["content"] in ("yes", "no")
    assert health.status_code == 200 and health.json()["in_flight"] == 0


async def test_max_body_mb_sets_the_cap(tmp_path):
    from fixtures_serve import ServeProcess

    server = ServeProcess(tmp_path / "serve.log", "--max-body-mb", "0.5")
    try:
        server.wait_ready()
        async with httpx.AsyncClient(timeout=120) as client:
            over = await client.post(_url(server), json={**ORDINARY, "messages": [
                {"role": "user", "content": "w" * 600_000}]})
            under = await client.post(_url(server), json={**ORDINARY, "max_tokens": 2})
    finally:
        server.stop()
    assert over.status_code == 413 and "at most 524,288 bytes" in _message(over)
    assert under.status_code == 200


async def test_fields_it_cannot_honour_and_unbounded_stops_are_refused(served_model):
    """Structured outputs other than a choice list, vLLM's guided_json / guided_regex, and stop strings past their
    bounds get a 400 naming the field, never a reply that silently ignored them."""
    async with httpx.AsyncClient(timeout=120) as client:
        for extra, named in (({"guided_json": {"type": "object"}}, "guided_json"),
                             ({"guided_regex": "[0-9]+"}, "guided_regex"),
                             ({"structured_outputs": {"json": {"type": "object"}}}, "json"),
                             ({"stop": ["x"] * 17}, "stop"), ({"stop": "y" * 300}, "stop")):
            r = await client.post(_url(served_model), json={**ORDINARY, "max_tokens": 2, **extra})
            assert r.status_code == 400 and named in _message(r), (extra, r.text[:200])
        ok = await client.post(_url(served_model), json={**ORDINARY, "max_tokens": 2, "stop": ["a", "b"]})
    assert ok.status_code == 200
