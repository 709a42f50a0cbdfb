"""`BatchKV`: the running batch's KV cache, attention mask and positions for continuous batching in `HFEngine`.

Rows are left-padded: every row's cached tokens end at the same column, so one decode step appends one column for
all rows. New rows are prefilled on their own and merged in by left-padding whichever side is shorter; finished
rows are dropped and all-padding columns on the left trimmed. Padded columns carry attention-mask 0 and zero
keys/values, so they never contribute. RoPE positions are tracked per row (count of real tokens), not per column.

A row may also start from keys/values computed earlier (a parked conversation, `hf_prefix.py`): `prefill_inputs`
lays such rows out as [past block | new tokens], each right-aligned in its block, so the mask has a gap between
the two; positions stay per row, so the gap changes nothing. `row_kv` copies a leaving row's real columns out.

Each layer's keys/values are a window `[start, end)` of buffers with spare columns (`GrowingLayer`): a decode step
writes its column in place, and a buffer is replaced by one half again larger (in `GROW_COLUMNS` chunks) only when
full. transformers' `DynamicLayer` instead concatenates a new, one-column-longer tensor every step, a fresh
allocation and a full copy per layer per step. Measured (`bench/hf_decode.py`, 64 rows): 1.10x the tokens/s on CPU,
1.02x on an H200, where other per-step costs dominate. Left out: paged/block memory management; this is for small
batches on CPU or one GPU.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

GROW_COLUMNS = 128
"""Buffers grow in multiples of this many columns (tokens)."""
GROWTH = 0.5
"""A full buffer is replaced by one this much larger (bench/hf_decode.py sets 1 column and 0 growth to measure the
one-new-tensor-per-step baseline)."""


def _capacity(needed: int, current: int) -> int:
    """Columns for a buffer that must hold `needed`: `GROWTH` more than now, rounded up to `GROW_COLUMNS`."""
    want = max(needed, current + int(current * GROWTH))
    return -(-want // GROW_COLUMNS) * GROW_COLUMNS


class GrowingLayer(DynamicLayer):
    """One layer's keys/values as the window `[start, end)` of [B, H_kv, capacity, D] buffers (for `BatchKV` only:
    transformers' crop/reorder helpers are not supported). `keys`/`values` are views of the window."""

    def __init__(self, *args: Any, **kwargs: Any):
        CacheLayerMixin.__init__(self)
        self.k_buf: torch.Tensor | None = None
        self.v_buf: torch.Tensor | None = None
        self.start = self.end = 0

    @classmethod
    def holding(cls, k_buf: torch.Tensor, v_buf: torch.Tensor, start: int, end: int) -> "GrowingLayer":
        layer = cls()
        layer.lazy_initialization(k_buf, v_buf)
        layer.k_buf, layer.v_buf, layer.start, layer.end = k_buf, v_buf, start, end
        layer._publish()
        return layer

    @property
    def capacity(self) -> int:
        return 0 if self.k_buf is None else int(self.k_buf.shape[-2])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `n` columns ([B, H_kv, n, D]) in place; return the whole window."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.end + n > self.capacity:
            self._grow(key_states, value_states, self.end - self.start + n)
        self.k_buf[:, :, self.end:self.end + n].copy_(key_states)
        self.v_buf[:, :, self.end:self.end + n].copy_(value_states)
        self.end += n
        self._publish()
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        cap = _capacity(needed, self.capacity)
        k = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
        v = value_states.new_empty((*value_states.shape[:2], cap, value_states.shape[-1]))
        used = self.end - self.start
        if used:
            k[:, :, :used].copy_(self.k_buf[:, :, self.start:self.end])
            v[:, :, :used].copy_(self.v_buf[:, :, self.start:self.end])
        self.k_buf, self.v_buf, self.start, self.end = k, v, 0, used

    def _publish(self) -> None:
        self.keys = self.k_buf[:, :, self.start:self.end]  # [B, H_kv, T, D]
        self.values = self.v_buf[:, :, self.start:self.end]


def _new_cache(layers: list[GrowingLayer] | None = None) -> Any:
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer  # a prefill appends one per model layer
    if layers:
        cache.layers = layers
    return cache


class BatchKV:
    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [B, T] 1 = real cached token
        self.next_pos: torch.Tensor | None = None  # [B] position id of each row's next token
        self._step_mask: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    def new_cache(self) -> Any:
        return _new_cache()

    def left_pad(self, prompts: list[list[int]], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefill inputs: ids, mask and positions, each [n, P] with P the longest prompt."""
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, longest - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, P]
        return ids.to(device), mask.to(device), positions.to(device)

    def prefill_inputs(self, suffixes: list[list[int]], pasts: list[list[tuple[torch.Tensor, torch.Tensor]]],
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Prefill inputs for rows that continue cached keys/values: `pasts[i]` holds, per layer, row i's keys and
        values ([H_kv, L_i, D]) and `suffixes[i]` its new tokens. Returns ids and positions [n, S], the mask
        [n, L + S] (L, S the longest past and suffix) and a cache holding the past block."""
        n = len(suffixes)
        past_lens = [int(p[0][0].shape[-2]) for p in pasts]
        width_l, width_s = max(past_lens), max(len(x) for x in suffixes)
        ids = torch.full((n, width_s), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width_l + width_s), dtype=torch.long)
        positions = torch.zeros((n, width_s), dtype=torch.long)
        for i, (suffix, past_len) in enumerate(zip(suffixes, past_lens)):
            ids[i, width_s - len(suffix):] = torch.tensor(suffix, dtype=torch.long)
            mask[i, width_l - past_len:width_l] = 1
            mask[i, width_l + width_s - len(suffix):] = 1
            positions[i, width_s - len(suffix):] = torch.arange(past_len, past_len + len(suffix))
        cap = _capacity(width_l + width_s + 1, 0)
        layers = []
        for li in range(len(pasts[0])):
            k0 = pasts[0][li][0]
            k_buf = k0.new_zeros((n, k0.shape[0], cap, k0.shape[-1]))
            v_buf = torch.zeros_like(k_buf)
            for i, past in enumerate(pasts):
                k_buf[i, :, width_l - past_lens[i]:width_l].copy_(past[li][0])
                v_buf[i, :, width_l - past_lens[i]:width_l].copy_(past[li][1])
            layers.append(GrowingLayer.holding(k_buf, v_buf, 0, width_l))
        return ids.to(device), mask.to(device), positions.to(device), _new_cache(layers)

    @staticmethod
    def expand(cache: Any, index: torch.Tensor) -> Any:
        """A prefill cache whose row i is row `index[i]` of `cache` (rows that share a prompt)."""
        return _new_cache([GrowingLayer.holding(layer.k_buf.index_select(0, index),
                                                layer.v_buf.index_select(0, index), layer.start, layer.end)
                           for layer in cache.layers])

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s cached keys/values, per layer ([H_kv, L, D] copies of its real columns, in order)."""
        cols = self.mask[row].nonzero().squeeze(-1)
        return [(layer.keys[row].index_select(1, cols), layer.values[row].index_select(1, cols))
                for layer in self.cache.layers]

    def merge(self, cache: Any, mask: torch.Tensor, next_pos: torch.Tensor) -> None:
        """Add freshly prefilled rows (their cache, mask [n, P], next positions [n]) to the batch."""
        if self.cache is None:
            self.cache, self.mask, self.next_pos = cache, mask, next_pos
            return
        old_t, new_t = self.mask.shape[1], mask.shape[1]
        width = max(old_t, new_t)
        merged = []
        for old, new in zip(self.cache.layers, cache.layers):
            cap = max(old.capacity, _capacity(width + 1, 0))  # room for the next step
            bufs = []
            for a, b in ((old.keys, new.keys), (old.values, new.values)):
                buf = a.new_zeros((a.shape[0] + b.shape[0], a.shape[1], cap, a.shape[-1]))  # zero padding columns
                buf[:a.shape[0], :, width - old_t:width].copy_(a)
                buf[a.shape[0]:, :, width - new_t:width].copy_(b)
                bufs.append(buf)
            merged.append(GrowingLayer.holding(bufs[0], bufs[1], 0, width))
        self.cache = _new_cache(merged)
        self.mask = torch.cat([F.pad(self.mask, (width - old_t, 0)), F.pad(mask, (width - new_t, 0))], dim=0)
        self.next_pos = torch.cat([self.next_pos, next_pos])

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask [B, T+1] and positions [B, 1] for feeding one new token per row."""
        ones = torch.ones((self.rows, 1), dtype=self.mask.dtype, device=self.mask.device)
        self._step_mask = torch.cat([self.mask, ones], dim=1)
        return self._step_mask, self.next_pos[:, None]

    def advance(self, alive: torch.Tensor | None = None) -> None:
        """The step's tokens are now cached. `alive` [B] (1/0): rows whose position moves on (finished rows still in
        the batch stay at theirs); None = all."""
        self.mask, self._step_mask = self._step_mask, None
        self.next_pos = self.next_pos + (1 if alive is None else alive)

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in order); trim columns that are padding in every remaining row."""
        if not keep:
            self.cache = self.mask = self.next_pos = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        real_cols = self.mask.any(0).nonzero()
        trim = int(real_cols[0]) if len(real_cols) else 0
        self.mask = self.mask[:, trim:]
        # The buffers keep their spare columns, so the next decode step still writes in place.
        self.cache = _new_cache([
            GrowingLayer.holding(layer.k_buf.index_select(0, index), layer.v_buf.index_select(0, index),
                                 layer.start + trim, layer.end)
            for layer in self.cache.layers
        ])
