"""The serving campaign of the chaos benchmark: abusive requests against a real `rlfactory serve` while ordinary
requests are in flight.

    python bench/chaos_serve.py --json bench/results/chaos_serve.json [--seed 0] [--quick]

A real `rlfactory serve --tiny-random` subprocess (the one the serve tests use, tests/fixtures_serve.py) on a free
port. Ordinary clients (plain chat, tools, n=2, streaming, `enable_thinking: false`, an 11-score forced choice)
send requests back to back, four at a time, for the whole campaign; meanwhile abusive clients fire, in seeded
order: chat_template_kwargs the template does not take (`return_tensors`, `tokenize`, `add_generation_prompt`,
`chat_template`, ...), forced choices that are too many (65), too long (the 7 KB request of issue 40) or at both
limits (64 choices of ~100 tokens), 10 MB bodies (sized and chunked), a 6 MB prompt and a 160,000-turn conversation
(under the body cap, over the context), seeds past 2^63 and negative, malformed / deep / non-finite JSON, and
clients that give up mid-generation. `/health` is asked every 50 ms throughout.

Figures: `serve_requests_failed_by_others` — ordinary requests that did not get a 200 (must be 0);
`serve_max_rss_growth_mb` — the server process's peak resident memory (psutil, every 10 ms) over its idle
resident memory after a warm-up of ordinary requests (goal <= 500); and detail: each abusive kind's statuses
against the status it should get, the slowest `/health` answer, counts.
"""
from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # fixtures_serve.ServeProcess: the served model of the serve tests
from fixtures_serve import ServeProcess

CALC_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
HI = [{"role": "user", "content": "What is 6*7?"}]


def _ordinary(rng: random.Random) -> dict[str, Any]:
    """One ordinary request, of a seeded random kind."""
    base = {"model": "tiny-random", "messages": HI, "max_tokens": rng.choice([4, 12, 24]), "seed": rng.randrange(2**31)}
    kind = rng.choice(["plain", "tools", "n2", "stream", "no_think", "score"])
    extra = {"plain": {}, "tools": {"tools": [CALC_TOOL]}, "n2": {"n": 2}, "stream": {"stream": True},
             "no_think": {"chat_template_kwargs": {"enable_thinking": False}},
             "score": {"guided_choice": [str(i) for i in range(11)], "temperature": 0}}[kind]
    return {**base, **extra}


def _abusive(quick: bool) -> list[tuple[str, int, Any]]:
    """(kind, expected status, body): a dict sent as JSON, bytes sent as they are, or a callable for chunked bodies.
    Status 0: a client that gives up (no status expected)."""
    msg = {"model": "tiny-random", "messages": HI, "max_tokens": 8}
    ten_mb = json.dumps({**msg, "messages": [{"role": "user", "content": "w" * 10 * 2**20}]}).encode()

    def chunked():
        for i in range(0, len(ten_mb), 2**16):
            yield ten_mb[i:i + 2**16]

    cases: list[tuple[str, int, Any]] = []
    for key, value in (("return_tensors", "pt"), ("tokenize", False), ("add_generation_prompt", False),
                       ("chat_template", "{% for i in range(10**9) %}x{% endfor %}"), ("padding", "max_length"),
                       ("messages", []), ("return_dict", True), ("unknown_switch", 1)):
        cases.append((f"template_kwargs:{key}", 400, {**msg, "chat_template_kwargs": {key: value}}))
    cases += [
        ("guided_choice:7KB", 400, {**msg, "guided_choice": [f"{i} " + "word " * 180 for i in range(8)]}),
        ("guided_choice:65", 400, {**msg, "guided_choice": [str(i) for i in range(65)]}),
        ("guided_choice:64x100tok", 200, {**msg, "temperature": 0,
                                          "guided_choice": [f"label {i} " + "yes " * 100 for i in range(64)]}),
        ("structured_outputs:64x100tok", 200, {**msg, "temperature": 0.7, "n": 4, "structured_outputs": {
            "choice": [f"label {i} " + "no " * 100 for i in range(64)]}}),
        ("body:10MB", 413, ten_mb),
        ("body:10MB_chunked", 413, chunked),
        ("prompt:6MB", 400, {**msg, "messages": [{"role": "user", "content": "word " * (6 * 2**20 // 5)}]}),
        ("prompt:160k_turns", 400, {**msg, "messages": [{"role": ("user", "assistant")[i % 2], "content": "x"}
                                                        for i in range(160_000)]}),
        ("seed:2^63", 400, {**msg, "seed": 2**63}), ("seed:2^64", 400, {**msg, "seed": 2**64}),
        ("seed:2^100", 400, {**msg, "seed": 2**100}), ("seed:-1", 400, {**msg, "seed": -1}),
        ("json:NaN", 400, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
        ("json:deep", 400, b"[" * 100_000), ("json:truncated", 400, b'{"messages": [{"role": '),
        ("json:not_utf8", 400, b'{"messages": "\xff\xfe"}'), ("json:big_int", 400, b'{"n": ' + b"9" * 5000 + b"}"),
        ("temperature:1e-30", 200, {**msg, "temperature": 1e-30}), ("top_k:2^70", 200, {**msg, "top_k": 2**70}),
        ("gives_up", 0, {**msg, "max_tokens": 4000}),
    ]
    return cases if not quick else [c for c in cases if c[0] != "prompt:160k_turns"]


class RssPeak:
    """Peak resident memory of process `pid`, sampled every 10 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.proc, self.peak, self.stop = psutil.Process(pid), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __enter__(self) -> RssPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


async def _send(client: httpx.AsyncClient, url: str, body: Any, timeout: float | None = None) -> int:
    if isinstance(body, dict):
        r = await client.post(url, json=body, timeout=timeout)
    elif isinstance(body, bytes):
        r = await client.post(url, content=body, headers={"content-type": "application/json"}, timeout=timeout)
    else:
        async def pieces():
            for piece in body():
                yield piece
        r = await client.post(url, content=pieces(), headers={"content-type": "application/json"}, timeout=timeout)
    if r.status_code != 200 or "text/event-stream" not in r.headers.get("content-type", ""):
        r.json()  # every answer, errors included, is JSON
    return r.status_code


async def _run(server: ServeProcess, *, seed: int, quick: bool) -> dict[str, Any]:
    rng = random.Random(seed)
    url = f"{server.base_url}/chat/completions"
    health_url = f"http://127.0.0.1:{server.port}/health"
    ordinary: dict[str, int] = {}
    ordinary_failures: list[str] = []
    abusive: dict[str, dict[str, int]] = {}
    health_s: list[float] = []
    done = asyncio.Event()

    async with httpx.AsyncClient(timeout=300) as client:
        async def ordinary_client(worker: int) -> None:
            local = random.Random(seed * 1000 + worker)
            while not done.is_set():
                body = _ordinary(local)
                try:
                    status = await _send(client, url, body)
                except Exception as e:  # noqa: BLE001 - a reset connection or a non-JSON answer fails it too
                    status, detail = -1, f"{type(e).__name__}: {e}"
                else:
                    detail = ""
                ordinary[str(status)] = ordinary.get(str(status), 0) + 1
                if status != 200:
                    ordinary_failures.append(f"{sorted(k for k in body if k not in ('model', 'messages'))}: "
                                             f"{status} {detail}"[:300])

        async def health_client() -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                (await client.get(health_url, timeout=300)).raise_for_status()
                health_s.append(time.perf_counter() - t0)
                await asyncio.sleep(0.05)

        async def abuse(kind: str, expected: int, body: Any) -> None:
            try:
                status = await _send(client, url, body, timeout=0.5 if expected == 0 else None)
                got = str(status)
            except httpx.TimeoutException:
                got = "gave up" if expected == 0 else "timeout"
            except Exception as e:  # noqa: BLE001 - a reset connection or a non-JSON answer is counted by name
                got = type(e).__name__
            row = abusive.setdefault(kind, {"expected": expected})
            row[got] = row.get(got, 0) + 1

        # Warm-up: the engine's and the allocator's working memory for ordinary traffic belongs to the idle figure.
        await asyncio.gather(*(_send(client, url, _ordinary(rng)) for _ in range(12)))
        await asyncio.sleep(1.0)
        idle_rss = psutil.Process(server.pid).memory_info().rss
        cases = _abusive(quick) * (1 if quick else 2)
        rng.shuffle(cases)
        started = time.perf_counter()
        with RssPeak(server.pid) as rss:
            background = [asyncio.ensure_future(ordinary_client(w)) for w in range(4)]
            background.append(asyncio.ensure_future(health_client()))
            queue = list(cases)

            async def abuser() -> None:
                while queue:
                    await abuse(*queue.pop())

            await asyncio.gather(*(abuser() for _ in range(3)))
            done.set()
            await asyncio.gather(*background)
        abuse_s = time.perf_counter() - started
    unexpected = {k: v for k, v in abusive.items()
                  if set(v) - {"expected"} != {"gave up" if v["expected"] == 0 else str(v["expected"])}}
    return {
        "serve_requests_failed_by_others": sum(n for s, n in ordinary.items() if s != "200"),
        "serve_max_rss_growth_mb": round((rss.peak - idle_rss) / 2**20, 1),
        "serve_idle_rss_mb": round(idle_rss / 2**20, 1),
        "ordinary_requests": sum(ordinary.values()),
        "ordinary_statuses": ordinary,
        "ordinary_failures": ordinary_failures[:10],
        "abusive_requests": len(cases),
        "abusive_statuses": abusive,
        "abusive_unexpected": unexpected,
        "health_answers": len(health_s),
        "health_max_s": round(max(health_s), 3) if health_s else None,
        "abuse_s": round(abuse_s, 1),
    }


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    """Start `rlfactory serve --tiny-random`, run the campaign against it, stop it; the figures."""
    server = ServeProcess(tmp / "serve.log")
    try:
        server.wait_ready()
        result = asyncio.run(_run(server, seed=seed, quick=quick))
        result["server_alive_after"] = server.proc.poll() is None
        return result
    finally:
        server.stop()


def main() -> None:
    from campaign_cli import run_campaign  # bench/ is on the path when this file runs as a script

    run_campaign(__doc__, campaign, name="serve", quick_help="each abusive request once, without the 160,000-turn one")


if __name__ == "__main__":
    main()
