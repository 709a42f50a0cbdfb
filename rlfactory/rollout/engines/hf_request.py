"""What `HFEngine` keeps per request and counts overall: the request record its worker thread fills token by token,
when a request stops, and how its result gets back to the caller's event loop (from the worker thread)."""
from __future__ import annotations

import asyncio
import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from rlfactory.rollout.engines.hf_prefix import Parked
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams


@dataclass
class EngineStats:
    """Counters since the engine started (read `HFEngine.stats`)."""

    requests: int = 0
    prefill_batches: int = 0
    """Forward passes that admitted new requests; fewer than `requests` means requests were batched."""
    decode_steps: int = 0
    generated_tokens: int = 0
    max_batch_rows: int = 0
    """Most sequences decoded together in one step."""
    busy_s: float = 0.0
    """Seconds the worker spent in forward passes and sampling."""
    prefill_s: float = 0.0
    """Of `busy_s`: seconds in prefills (forward and first sample)."""
    decode_s: float = 0.0
    """Of `busy_s`: seconds in decode steps (forward and sample)."""
    prefill_tokens: int = 0
    """Prompt tokens run through the model in prefills (after the prefix cache)."""
    prefix_cached_tokens: int = 0
    """Prompt tokens the prefix cache spared: shared prompts of a prefill and parked conversations."""


@dataclass
class Request:
    """One `generate` call as the worker thread holds it."""

    prompt_ids: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator
    stop_ids: frozenset[int]
    request_id: str
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)
    finish: str | None = None
    cancelled: bool = False
    past: Parked | None = None
    """Parked keys/values of this conversation's earlier turns (the prefix cache), taken when admitted."""
    kv_key: int | None = None
    """`HFEngine._weights_key()` when its keys/values were computed (the prefix cache)."""
    vision: Any = None
    """`hf_vision.VisionRequest` of a prompt with images; None for text."""

    @property
    def match_ids(self) -> list[int]:
        """What the prefix cache matches this request on: the prompt, its images' placeholders keyed by content."""
        return self.prompt_ids if self.vision is None else self.vision.match_ids

    @property
    def rope_delta(self) -> int:
        return 0 if self.vision is None else self.vision.rope_delta


def finish_reason(r: Request, tok: int, max_context: int, tokenizer: Any) -> str | None:
    """Why `r` stops after sampling `tok` (stop, length), or None while it goes on."""
    if tok in r.stop_ids:
        return "stop"
    if r.sampling.stop_strings and _hit_stop_string(r, tokenizer):
        return "stop"
    if len(r.out_ids) >= r.sampling.max_new_tokens or len(r.prompt_ids) + len(r.out_ids) >= max_context:
        return "length"
    return None


def _hit_stop_string(r: Request, tokenizer: Any) -> bool:
    # Decode only a window of recent tokens: a stop string that was not in the previous window must end in the
    # newest token. (+4 tokens covers multi-byte characters split across tokens.)
    longest = max(len(s) for s in r.sampling.stop_strings)
    window = tokenizer.decode(r.out_ids[-(longest + 4):], skip_special_tokens=False)
    return any(s in window for s in r.sampling.stop_strings)


def _deliver(r: Request, error: BaseException | None) -> None:
    """Set `r`'s future (on its event loop)."""
    if r.future.done():
        return
    if error is not None and r.cancelled:  # its caller is gone: an exception nobody reads only warns
        r.future.cancel()
    elif error is not None:
        r.future.set_exception(error)
    else:
        r.future.set_result(GenerationOutput(
            token_ids=r.out_ids, logprobs=r.out_logprobs, finish_reason=r.finish or "stop", versions=r.out_versions))


def resolve_many(reqs: list[Request], error: BaseException | None = None) -> None:
    """Hand each request's output (or `error`) to the event loop that awaits it, from the worker thread: one wake-up
    per event loop (a wake-up is a write to the loop's self-pipe), not one per request."""
    by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list[Request]]] = {}
    for r in reqs:
        by_loop.setdefault(id(r.loop), (r.loop, []))[1].append(r)
    for loop, group in by_loop.values():
        def deliver(group: list[Request] = group) -> None:
            for r in group:
                _deliver(r, error)
        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the caller's event loop is gone; nobody is waiting
            pass


def new_tokens(r: Request) -> int:
    """Tokens a request's prefill runs: the whole prompt, or what follows its parked prefix."""
    return len(r.prompt_ids) - (len(r.past.tokens) if r.past is not None else 0)


def checked_prompt(prompt_ids: Any, vocab_size: int) -> list[int]:
    """`prompt_ids` as a list of ints in [0, vocab_size), or ValueError: a prompt the model cannot embed would fail
    the whole batch's prefill, and with it every request prefilled or decoded with it."""
    try:
        ids = [operator.index(t) for t in prompt_ids]
    except TypeError as e:
        raise ValueError(f"generate: prompt_ids must be a flat sequence of integer token ids ({e})") from None
    if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise ValueError(f"generate: prompt token id {bad} is outside the model's vocabulary (0..{vocab_size - 1}); "
                         f"the tokenizer and the model do not match")
    return ids
