"""`HFEngine`: a transformers causal LM behind the `GenerationEngine` interface, with continuous batching.

Many trajectories `await engine.generate(...)` at once. A worker thread (so the event loop keeps serving tool calls
while the model computes) gathers waiting requests, prefills them together (left-padded, one forward), merges them
into the running batch's KV cache, and decodes the whole batch one token per step. Requests join between decode
steps and leave as soon as they stop (stop token, stop string, max_new_tokens, context limit, cancellation).
When idle, the first request waits `batch_wait_ms` for company before its prefill.

Weights: `update_weights(state_dict)` copies new weights in between steps. When the engine shares the trainer's
model object (the local trainer), the optimizer already updated those tensors in place and the call is a no-op;
the trainer must then not step the optimizer while a rollout is generating. With a `weight_source` (the shared
weights of an asynchronous run, followed with `follow_weights`) the worker loads a newer published version before
each step, so requests in flight continue under the new weights (their KV cache from the old ones is kept). Every
sampled token is stamped with `policy_version`, the version of the weights that sampled it.
Prefix cache (`prefix_cache=True`): requests prefilled together with the same prompt (a GRPO group's samples) run it
through the model once and share its keys/values; and a finished request's keys/values are parked
(`hf_prefix.ParkedKV`), so the next turn of its conversation prefills only the tool response and what follows (the
branches of a branched group, admitted together, all continue their root's parked entry). Parked entries are valid while
the weights stay those that computed them, or pushed versions (`weight_source`) that conversations in flight carry on
under, as rows in the running batch do; any other change of the weights (an optimizer step on a shared model,
`update_weights`) invalidates them. The same maths as prefilling everything, up to float summation order.
Images (a vision-language policy, `vision=`): `generate(..., images=)` takes the images of the prompt's placeholder
runs; prefills pass their pixels and every forward its multimodal positions, and the prefix cache matches images
by content (`hf_vision.py`).
Left out: prefix sharing across conversations beyond identical prompts, speculative decoding, paged attention (use
the vLLM engine for those).
See `hf_sampling` for the logprob convention.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections import deque
from typing import Any, Mapping

import torch

from rlfactory.models.devices import avoid_cudnn_attention, resolve_device
from rlfactory.models.precision import autocast
from rlfactory.models.vision import VisionProcessor, is_vision_model
from rlfactory.rollout.engines import hf_vision
from rlfactory.rollout.engines.hf_kv import BatchKV
from rlfactory.rollout.engines.hf_prefix import Parked, ParkedKV, shared_past
from rlfactory.rollout.engines.hf_request import (
    EngineStats,
    Request,
    checked_prompt,
    finish_reason,
    new_tokens,
    resolve_many,
)
from rlfactory.rollout.engines.hf_sampling import RowSampler, make_generator
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams, WeightSource
from rlfactory.tools.types import ToolImage

logger = logging.getLogger(__name__)


COMPACT_MIN_ROWS = 4
"""Finished rows stay in the running batch until at least this many (and a quarter of the live ones) have gathered:
then one compaction removes them all (measured on CPU for the quickstart's model: a dead row costs ~0.1 ms a decode
step; a compaction moves one row per finished row, two indexed copies per layer)."""


class HFEngine:
    """Dynamic/continuous batching generation on a transformers causal LM (CPU, or one GPU when present)."""

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        eos_token_ids: list[int] | int,
        max_batch_size: int = 64,
        batch_wait_ms: float = 2.0,
        device: Any = None,
        tokenizer: Any = None,
        max_prefill_tokens: int = 32_768,
        weight_source: WeightSource | None = None,
        prefix_cache: bool = False,
        prefix_cache_tokens: int = 32_768,
        vision: VisionProcessor | None = None,
    ):
        """`tokenizer` is only needed for `stop_strings`. `max_prefill_tokens` caps padded tokens per prefill.
        `weight_source`: pushed weights to load newer versions from between steps (as `follow_weights` sets).
        `prefix_cache`: share identical prompts within a prefill and park finished requests' keys/values (at most
        `prefix_cache_tokens` tokens) for their conversations' next turns. `vision`: a VL policy's image processor
        (`models/vision.py` `vision_of(tokenizer)`), for requests with images.

        On CPU, a `max_batch_size` whose [rows, vocab] fp32 logits stay under 32 MB (48 rows for Qwen's 151,669 ids)
        lets the allocator reuse each step's logits buffer; larger steps page-fault a fresh one every step.
        """
        self.device = resolve_device(device)
        avoid_cudnn_attention(self.device)
        if next(model.parameters()).device != self.device:
            model.to(self.device)
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = frozenset([eos_token_ids] if isinstance(eos_token_ids, int) else eos_token_ids)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.tokenizer = tokenizer
        self.max_prefill_tokens = max_prefill_tokens
        self.max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.vocab_size = int(getattr(model.config, "vocab_size", None) or 1 << 62)
        """Token ids a prompt may hold (`generate` refuses others before they reach a batch)."""
        self.stats = EngineStats()
        self.policy_version = 0
        """The version of the weights now loaded (set by the trainer, or loaded from `weight_source`)."""
        self.worker_cpus: set[int] | None = None
        """CPUs for the decoding thread alone (set before the first request; None = the caller's)."""
        self.weight_source = weight_source
        self.weight_loads = 0
        self.weight_load_s = 0.0
        self._pending: deque[Request] = deque()
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()  # held for every forward pass and for weight loads
        self._worker: threading.Thread | None = None
        self._closed = False
        self._sampler = RowSampler()  # used by the worker thread only
        self.prefix_cache = prefix_cache
        self._parked = ParkedKV(prefix_cache_tokens) if prefix_cache else None
        self._params = list(model.parameters())
        self.vision = vision
        self.is_vl = is_vision_model(model)
        self._pushed_updates = 0

    # ----------------------------------------------------------------- public API
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None,
        images: list[ToolImage] | None = None,
    ) -> GenerationOutput:
        if self._closed:
            raise RuntimeError("HFEngine.generate called after close()")
        prompt_ids = checked_prompt(prompt_ids, self.vocab_size)  # fails this request alone, not its batch
        if not prompt_ids:
            raise ValueError("generate: prompt_ids is empty; render at least the chat template's prompt")
        if len(prompt_ids) >= self.max_context:
            raise ValueError(
                f"generate: prompt of {len(prompt_ids)} tokens does not fit the model's context "
                f"({self.max_context}); shorten it or raise max_position_embeddings"
            )
        if sampling.stop_strings and self.tokenizer is None:
            raise ValueError("generate: stop_strings need HFEngine(..., tokenizer=...) to decode the output")
        vision = hf_vision.prepare(prompt_ids, images or [], self.vision, self.is_vl)
        if sampling.max_new_tokens <= 0:
            return GenerationOutput(token_ids=[], logprobs=[], finish_reason="length")
        loop = asyncio.get_running_loop()
        req = Request(
            prompt_ids=prompt_ids, sampling=sampling, loop=loop, future=loop.create_future(),
            generator=make_generator(sampling.seed, self.device),
            stop_ids=self.eos_token_ids | frozenset(sampling.stop_token_ids),
            request_id=request_id or uuid.uuid4().hex, vision=vision,
        )
        with self._cond:
            self._pending.append(req)
            self.stats.requests += 1
            self._ensure_worker()
            self._cond.notify()
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.cancelled = True  # the worker drops it at the next step
            raise

    async def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load new weights between decode steps (a no-op when `state_dict` holds this model's own tensors)."""
        await asyncio.to_thread(self._load_weights, state_dict)

    async def follow_weights(self, source: WeightSource) -> None:
        """The weight-push contract (`protocol.FollowsWeights`): load `source`'s current version now, then each newer
        one before a step."""
        self.weight_source = source
        await asyncio.to_thread(self.load_pushed_weights)

    def load_pushed_weights(self) -> bool:
        """Load the weight source's version now if it is newer than the one loaded; True when it was."""
        if self.weight_source is None:
            return False
        with self._step_lock:
            return self._poll_weights()

    def _updates(self) -> int:
        return sum(p._version for p in self._params)

    def _weights_key(self) -> int:
        """Which keys/values may continue together: the parameters' in-place update counters (an optimizer step or
        a load on a model shared with the trainer bumps them without telling the engine), less those bumped by
        pushed weights, under which conversations in flight continue (partial rollouts, as rows in the batch do)."""
        return self._updates() - self._pushed_updates

    def _poll_weights(self) -> bool:
        t0 = time.perf_counter()
        before = self._updates()
        got = self.weight_source.load_into(self.model, self.policy_version)
        if got is None:
            return False
        self.policy_version = got
        self._pushed_updates += self._updates() - before
        self.weight_loads += 1
        self.weight_load_s += time.perf_counter() - t0
        return True

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker is not None:
            await asyncio.to_thread(self._worker.join)
            self._worker = None
        self._sampler = RowSampler()  # frees the [rows, vocab] workspace

    # ----------------------------------------------------------------- worker side
    def _load_weights(self, state_dict: Mapping[str, Any]) -> None:
        own = {k: v.data_ptr() for k, v in self.model.state_dict().items()}
        if all(k in own and getattr(v, "data_ptr", lambda: -1)() == own[k] for k, v in state_dict.items()):
            return  # shared model: the optimizer already updated these tensors in place
        with self._step_lock:
            self.model.load_state_dict(dict(state_dict), strict=True)
            if self._parked is not None:
                self._parked.clear()

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="hf-engine", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        if self.worker_cpus and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.worker_cpus)  # Linux: this thread only
        batch = BatchKV(self.pad_token_id)
        rows: list[Request | None] = []  # the batch's rows in order; None = finished, not yet compacted away
        while True:
            with self._cond:
                while not self._pending and not rows and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
                idle = not rows
            if idle and self.batch_wait_s > 0:
                time.sleep(self.batch_wait_s)  # let concurrent callers join the first prefill
            admitted = self._take_pending(sum(r is not None for r in rows))
            started = time.perf_counter()
            try:
                rows = self._step(batch, rows, admitted)
            except Exception as e:  # a failed step fails its requests, not the engine
                live = [r for r in rows if r is not None]
                logger.exception("HF engine step failed; failing %d requests", len(live) + len(admitted))
                resolve_many(list({id(r): r for r in live + admitted}.values()), error=e)
                rows, batch = [], BatchKV(self.pad_token_id)
            finally:
                self.stats.busy_s += time.perf_counter() - started
        resolve_many([r for r in rows if r is not None] + list(self._pending), error=RuntimeError("HFEngine closed"))
        self._pending.clear()

    def _step(self, batch: BatchKV, rows: list[Request | None], admitted: list[Request]) -> list[Request | None]:
        """Admit (prefill) new rows, then decode one token for every live row. Returns the batch's rows (None for
        finished ones still in it)."""
        with self._step_lock, torch.inference_mode():
            if self.weight_source is not None:
                self._poll_weights()
            if admitted:
                rows = self._compact(batch, rows)  # new rows go after the live ones
                self._prefill(batch, rows, admitted)
                rows = self._evict(batch, rows)  # some stop on their first token
            if any(r is not None for r in rows):
                self._decode_step(batch, rows)
            return self._evict(batch, rows)  # compaction writes the cache's (inference) tensors in place

    def _take_pending(self, active: int) -> list[Request]:
        taken: list[Request] = []
        budget = self.max_prefill_tokens
        key = self._weights_key() if self._parked is not None and len(self._parked) else None
        with self._cond:
            while self._pending and active + len(taken) < self.max_batch_size:
                req = self._pending[0]
                if key is not None and req.past is None:
                    req.past = hf_vision.usable_past(
                        self._parked.take(req.match_ids, key) or shared_past(taken, req.match_ids), req.vision)
                longest = max(new_tokens(r) for r in taken + [req])
                if taken and longest * (len(taken) + 1) > budget:
                    break  # prefill cost is padded length x rows; the rest join at the next step
                self._pending.popleft()
                if not req.cancelled:
                    taken.append(req)
        return taken

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Any, vl: dict[str, Any] | None = None) -> torch.Tensor:
        """`vl`: a VL model's `position_ids` [4, B, T] (replacing the plain ones) and pixel inputs."""
        vl = dict(vl or {})
        position_ids = vl.pop("position_ids", position_ids)
        with autocast(self.model):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, logits_to_keep=1, **vl)
        return out.logits[:, -1, :].float()  # [B, V]

    def _prefill(self, batch: BatchKV, rows: list[Request], admitted: list[Request]) -> None:
        t0 = time.perf_counter()
        key = self._weights_key() if self.prefix_cache else None
        for r in admitted:
            if r.past is not None and r.past.key != key:
                r.past = None  # weights changed since it was taken: prefill the whole prompt
            r.kv_key = key
        fresh = [r for r in admitted if r.past is None]
        continued = [r for r in admitted if r.past is not None]
        if fresh:
            self._prefill_fresh(batch, fresh)
        if continued:
            self._prefill_continued(batch, continued)
        rows.extend(fresh + continued)
        self.stats.prefill_s += time.perf_counter() - t0

    def _prefill_fresh(self, batch: BatchKV, reqs: list[Request]) -> None:
        prompts, run = [r.prompt_ids for r in reqs], reqs
        index = None
        if self.prefix_cache:  # a group's samples arrive together with one prompt (and images): run it once
            first: dict[tuple[int, ...], int] = {}
            index = [first.setdefault(tuple(r.match_ids), len(first)) for r in reqs]
            if len(first) == len(prompts):
                index = None
            else:
                run = [reqs[index.index(k)] for k in range(len(first))]
                prompts = [r.prompt_ids for r in run]
        input_ids, mask, positions = batch.left_pad(prompts, self.device)
        cache = batch.new_cache()
        vl = hf_vision.forward_inputs([r.vision for r in run], positions, [(0, len(p)) for p in prompts],
                                      self.vision) if self.is_vl else {}
        logits = self._forward(input_ids, mask, positions, cache, vl)
        self.stats.prefill_batches += 1
        self.stats.prefill_tokens += sum(len(p) for p in prompts)
        idx = None
        if index is not None:
            idx = torch.tensor(index, dtype=torch.long, device=self.device)
            logits, mask = logits.index_select(0, idx), mask.index_select(0, idx)
            positions = positions.index_select(0, idx)
            self.stats.prefix_cached_tokens += sum(len(r.prompt_ids) for r in reqs) - sum(len(p) for p in prompts)
        self._sample(reqs, logits)
        batch.merge(cache, mask, positions[:, -1] + 1, index=idx)

    def _prefill_continued(self, batch: BatchKV, reqs: list[Request]) -> None:
        suffixes = [r.prompt_ids[len(r.past.tokens):] for r in reqs]
        input_ids, mask, positions, cache = batch.prefill_inputs(suffixes, [r.past.layers for r in reqs],
                                                                 self.device)
        spans = [(len(r.past.tokens), len(r.prompt_ids)) for r in reqs]
        for r in reqs:
            self.stats.prefix_cached_tokens += len(r.past.tokens)
            r.past = None  # its tensors now live in the batch
        vl = hf_vision.forward_inputs([r.vision for r in reqs], positions, spans, self.vision) if self.is_vl else {}
        logits = self._forward(input_ids, mask, positions, cache, vl)
        self.stats.prefill_batches += 1
        self.stats.prefill_tokens += sum(len(x) for x in suffixes)
        self._sample(reqs, logits)
        batch.merge(cache, mask, positions[:, -1] + 1)

    def _decode_step(self, batch: BatchKV, rows: list[Request | None]) -> None:
        # finished rows still in the batch feed padding at a frozen position; their logits are dropped
        t0 = time.perf_counter()
        last = torch.tensor([[r.out_ids[-1] if r is not None else self.pad_token_id] for r in rows],
                            device=self.device)  # [B, 1]
        mask, positions = batch.step_inputs()
        vl = {"position_ids": hf_vision.decode_positions(positions, [r.rope_delta if r is not None else 0
                                                                     for r in rows])} if self.is_vl else {}
        logits = self._forward(last, mask, positions, batch.cache, vl)
        live = [i for i, r in enumerate(rows) if r is not None]
        if len(live) == len(rows):
            batch.advance()
        else:
            alive = torch.zeros(len(rows), dtype=torch.long, device=self.device)
            alive[live] = 1
            batch.advance(alive)
            logits = logits[live]
        self.stats.decode_steps += 1
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(live))
        self._sample([rows[i] for i in live], logits)
        self.stats.decode_s += time.perf_counter() - t0

    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> None:
        if self.vision is not None:  # a policy never emits an image: a placeholder it sampled would have no pixels
            logits[:, self.vision.image_token_id] = float("-inf")
        tokens, logprobs = self._sampler(logits, [r.sampling for r in reqs], [r.generator for r in reqs])
        for r, tok, lp in zip(reqs, tokens, logprobs):
            r.out_ids.append(tok)
            r.out_logprobs.append(lp)
            r.out_versions.append(self.policy_version)
            self.stats.generated_tokens += 1
            r.finish = finish_reason(r, tok, self.max_context, self.tokenizer)

    def _evict(self, batch: BatchKV, rows: list[Request | None]) -> list[Request | None]:
        """Resolve finished rows (they stay in the batch as None) and compact the batch once enough have finished:
        a finished row costs a row of each decode step, a compaction a pass over every layer's buffers."""
        key: int | None = None  # the weights now loaded, summed once a row has finished
        finished: list[Request] = []
        for i, r in enumerate(rows):
            if r is None:
                continue
            if r.cancelled and r.finish is None:
                r.finish = "abort"
            if r.finish is not None:
                if self._parked is not None and r.finish != "abort":
                    key = self._weights_key() if key is None else key
                    if r.kv_key == key:  # every cached token (all but the last sampled one) is of these weights
                        self._parked.park(Parked(tuple(r.match_ids + r.out_ids[:-1]), batch.row_kv(i), key))
                finished.append(r)
                rows[i] = None
        resolve_many(finished)
        dead = sum(r is None for r in rows)
        if dead and (dead == len(rows) or dead >= max(COMPACT_MIN_ROWS, (len(rows) - dead) // 4)):
            rows = self._compact(batch, rows)
        return rows

    @staticmethod
    def _compact(batch: BatchKV, rows: list[Request | None]) -> list[Request | None]:
        """Drop finished rows from the batch (the last live rows take their places: the order changes)."""
        keep = [i for i, r in enumerate(rows) if r is not None]
        if len(keep) == len(rows):
            return rows
        return [rows[i] for i in batch.compact(keep)]

