"""LLM-as-judge reward over any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, `rlfactory serve`, ...).

`llm_judge` fills a prompt template with the task's question, the reference answer and the policy's final response,
asks the endpoint, and parses a score out of the reply with `parse_score`:
  1. a JSON object anywhere in the reply: {"score": 7} (out of `max_score`), or a verdict
     {"verdict": "correct"|"incorrect"} / {"correct": true};
  2. "Score: 7", "score = 7/10", "Score: 0.5/1" (the last such line wins; a "/N" overrides `max_score`);
  3. a reply that is only a number ("7", "7/10").
The result is normalised to [0, 1]. A reply with no score, or one outside [0, max_score], is a failed attempt.

Failed attempts (timeout, connection error, HTTP 429/5xx, unparseable reply) are retried `retries` times with
exponential backoff; then the judge raises `JudgeError`, which the RewardSet counts in `reward/errors` and scores
with the recipe's `failure_value`. Other HTTP errors (401, 404, ...) raise at once. With temperature 0 a retry of an
unparseable reply usually gets the same reply: raise the temperature if the judge is flaky.

Verdicts (never failures) are kept in the run's ToolCache — the same Redis as tool results — under keys in a
"judge" namespace built from (base_url, model, messages, sampling), so re-scoring the same response is free.
`concurrency` caps requests in flight per endpoint and model, across all trajectories of the event loop.

Left out: streaming, pairwise comparisons, and logprob-weighted scores.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import weakref
from typing import Any

import httpx

from rlfactory.tools.cache.base import cache_key
from rlfactory.tools.types import ToolResult

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM = "You are a strict grader. You compare a response with a reference answer and give a score."
DEFAULT_PROMPT = """Question:
{question}

Reference answer:
{answer}

Response to grade:
{response}

How well does the response answer the question, given the reference answer? Reply with one line
"Score: N/10" where N is an integer from 0 (wrong) to 10 (fully correct)."""

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_SCORE_RE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
_BARE_RE = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?\s*\.?\s*")
_VERDICTS = {"correct": 1.0, "yes": 1.0, "pass": 1.0, "true": 1.0, "incorrect": 0.0, "wrong": 0.0, "no": 0.0,
             "fail": 0.0, "false": 0.0}
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}

# Per event loop: one semaphore per (base_url, model, concurrency). Semaphores belong to the loop they first run on.
_limits: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, asyncio.Semaphore]]" = (
    weakref.WeakKeyDictionary())


class JudgeError(RuntimeError):
    """The judge gave no usable verdict after every retry."""


def _normalise(value: float, scale: float) -> float | None:
    if scale <= 0 or not 0 <= value <= scale:
        return None
    return value / scale


def _from_json(obj: Any, max_score: float) -> float | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("score"), (int, float)) and not isinstance(obj.get("score"), bool):
        scale = obj.get("max_score", max_score)
        return _normalise(float(obj["score"]), float(scale) if isinstance(scale, (int, float)) else max_score)
    for key in ("verdict", "correct", "judgement", "judgment"):
        v = obj.get(key)
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, str) and v.strip().lower() in _VERDICTS:
            return _VERDICTS[v.strip().lower()]
    return None


def parse_score(reply: str, max_score: float = 10.0) -> float | None:
    """A score in [0, 1] from a judge's reply, or None when it holds none (see the module docstring for formats)."""
    text = _THINK_RE.sub("", reply or "")
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        score = _from_json(obj, max_score)
        if score is not None:
            return score
    matches = _SCORE_RE.findall(text)
    if matches:
        value, scale = matches[-1]
        return _normalise(float(value), float(scale) if scale else max_score)
    m = _BARE_RE.fullmatch(text)
    if m:
        return _normalise(float(m[1]), float(m[2]) if m[2] else max_score)
    return None


def _question(task: dict) -> str:
    prompt = task.get("prompt", task.get("question", ""))
    if isinstance(prompt, list):  # a chat-format prompt: the last user message is the question
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def build_messages(template: str, question: str, answer: Any, response: str,
                   system_prompt: str | None = DEFAULT_SYSTEM) -> list[dict[str, str]]:
    """Chat messages for the judge. Only the placeholders {question}, {answer} and {response} are replaced, so
    templates may contain other braces (e.g. a JSON example)."""
    text = template
    for key, value in (("question", question), ("answer", "" if answer is None else answer), ("response", response)):
        text = text.replace("{" + key + "}", str(value))
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": text}]


def _semaphore(base_url: str, model: str, concurrency: int) -> asyncio.Semaphore:
    per_loop = _limits.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault((base_url, model, concurrency), asyncio.Semaphore(concurrency))


async def _ask(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> tuple[str | None, str]:
    """One attempt: (reply text, "") on an answer, (None, why) on a retryable failure; raises on a fatal one."""
    try:
        r = await client.post(url, json=body, headers=headers)
    except httpx.TimeoutException:
        return None, "timed out"
    except httpx.TransportError as e:
        return None, f"{type(e).__name__}: {e}"
    if r.status_code in _RETRY_STATUS:
        return None, f"HTTP {r.status_code}"
    if r.status_code >= 400:
        raise JudgeError(f"judge endpoint {url} answered HTTP {r.status_code}: {r.text[:300]}")
    try:
        return r.json()["choices"][0]["message"].get("content") or "", ""
    except (ValueError, KeyError, IndexError, TypeError):
        return None, f"malformed response body: {r.text[:200]!r}"


async def llm_judge(
    final_response: str,
    task: dict,
    answer: Any = None,
    cache: Any = None,
    *,
    base_url: str,
    model: str,
    prompt_template: str = DEFAULT_PROMPT,
    system_prompt: str | None = DEFAULT_SYSTEM,
    max_score: float = 10.0,
    temperature: float = 0.0,
    max_tokens: int = 256,
    timeout_s: float = 60.0,
    retries: int = 2,
    backoff_s: float = 1.0,
    concurrency: int = 8,
    api_key_env: str = "OPENAI_API_KEY",
    extra_body: dict[str, Any] | None = None,
    cache_ttl_s: float | None = 7 * 24 * 3600.0,
) -> float:
    """Score the final response in [0, 1] with an LLM judge at `base_url` (e.g. http://127.0.0.1:8000/v1).

    `extra_body` is merged into the request (e.g. {"guided_choice": ["0", ..., "10"]} for vLLM or `rlfactory serve`
    to force a bare score). The API key, if any, is read from the environment variable `api_key_env`.
    """
    response = _THINK_RE.sub("", final_response).strip()
    messages = build_messages(prompt_template, _question(task), answer, response, system_prompt)
    body = {"model": model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens,
            **(extra_body or {})}
    key = None
    if cache is not None:
        key = cache_key("judge", model, {"request": body, "max_score": max_score}, base_url.rstrip("/"))
        hit = await cache.get(key)
        if hit is not None:
            return float(json.loads(hit.text)["score"])

    url = base_url.rstrip("/") + "/chat/completions"
    api_key = os.environ.get(api_key_env)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    problem = ""
    async with _semaphore(base_url, model, concurrency), httpx.AsyncClient(timeout=timeout_s) as client:
        for attempt in range(retries + 1):
            if attempt:
                # Exponential backoff with jitter, so many judges retrying at once don't arrive together.
                await asyncio.sleep(backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
            reply, problem = await _ask(client, url, body, headers)
            if reply is None:
                logger.debug("judge attempt %d/%d failed: %s", attempt + 1, retries + 1, problem)
                continue
            score = parse_score(reply, max_score)
            if score is not None:
                break
            problem = f"no score in the reply {reply[:200]!r}"
            logger.debug("judge attempt %d/%d: %s", attempt + 1, retries + 1, problem)
        else:
            raise JudgeError(f"judge {model} at {base_url} gave no verdict after {retries + 1} attempts: {problem}")

    if cache is not None and key is not None:
        verdict = ToolResult(name="judge", server="judge", text=json.dumps({"score": score, "reply": reply}))
        await cache.set(key, verdict, cache_ttl_s)
    return score


FUZZY_MATCH_PROMPT = """Grade a student's answer to a question against the reference answer. The wording may differ:
the student's answer is correct when it means the same as the reference. "N/A" in either answer means that the task
cannot be done.
question: {question}
reference answer: {answer}
student answer: {response}
Reply with one JSON object: {"verdict": "correct"} or {"verdict": "incorrect"}."""


def fuzzy_match_judge(base_url: str, model: str, **options: Any):
    """A judge for WebArena's `fuzzy_match` evaluation (`(prediction, reference, intent) -> score in [0, 1]`, what the
    web tasks' Evaluator takes) over an OpenAI-compatible endpoint, through `llm_judge`; `options` go to it."""

    async def judge(prediction: str, reference: str, intent: str) -> float:
        return await llm_judge(prediction, {"question": intent}, reference, base_url=base_url, model=model,
                               prompt_template=FUZZY_MATCH_PROMPT, **options)

    return judge
