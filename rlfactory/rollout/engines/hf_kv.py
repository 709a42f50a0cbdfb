"""`BatchKV`: the running batch's KV cache, attention mask and positions for continuous batching in `HFEngine`.

Rows are left-padded: every row's cached tokens end at the same column, so one decode step appends one column for
all rows. New rows are prefilled on their own and merged in by left-padding whichever side is shorter; finished
rows are dropped and all-padding columns on the left trimmed. Padded columns carry attention-mask 0 and zero
keys/values, so they never contribute. RoPE positions are tracked per row (count of real tokens), not per column.

A row may also start from keys/values computed earlier (a parked conversation, `hf_prefix.py`): `prefill_inputs`
lays such rows out as [past block | new tokens], each right-aligned in its block, so the mask has a gap between
the two; positions stay per row, so the gap changes nothing. `row_kv` copies a leaving row's real columns out.

Each layer's keys/values are the first `rows` rows and the column window `[start, end)` of buffers with spare rows
and columns (`GrowingLayer`): a decode step writes its column in place, and a buffer is replaced by one half again
larger (in `GROW_COLUMNS` chunks) only when full. transformers' `DynamicLayer` instead concatenates a new,
one-column-longer tensor every step, a fresh allocation and a full copy per layer per step. Measured
(`bench/hf_decode.py`, 64 rows): 1.10x the tokens/s on CPU, 1.02x on an H200, where other per-step costs dominate.
Joining and leaving rows work in place too. `merge` writes the new rows into spare rows (and, when they are longer
than the window, zeroes the columns the window grows into on the left, kept free by `LEFT_MARGIN`), and `compact`
moves the last live rows into the rows that finished, so it copies at most one row per finished row. Before, both
copied the whole cache: with continuous batching (an asynchronous run admits a few rows at a time) that was ~10 % of
the engine's time on the quickstart. `compact` therefore changes the order of rows; it returns the new order.
Left out: paged/block memory management; this is for small batches on CPU or one GPU.
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
GROW_ROWS = 8
"""The running batch's buffers hold rows in multiples of this many."""
LEFT_MARGIN = 64
"""Free columns left of the window in the running batch's new buffers, so that a row longer than the window merges
in place (the window grows left)."""


def _capacity(needed: int, current: int, chunk: int = GROW_COLUMNS) -> int:
    """Room for `needed` columns (or rows): `GROWTH` more than now, rounded up to whole `chunk`s."""
    want = max(needed, current + int(current * GROWTH))
    return -(-want // chunk) * chunk


class GrowingLayer(DynamicLayer):
    """One layer's keys/values as rows `[0, rows)` and columns `[start, end)` of [R, H_kv, capacity, D] buffers (for
    `BatchKV` only: transformers' crop/reorder helpers are not supported). `keys`/`values` are views of the window.
    `margin`: free columns kept left of the window when the buffers are replaced."""

    def __init__(self, *args: Any, **kwargs: Any):
        CacheLayerMixin.__init__(self)
        self.k_buf: torch.Tensor | None = None
        self.v_buf: torch.Tensor | None = None
        self.start = self.end = self.rows = self.margin = 0

    @classmethod
    def holding(cls, k_buf: torch.Tensor, v_buf: torch.Tensor, start: int, end: int) -> "GrowingLayer":
        layer = cls()
        layer.lazy_initialization(k_buf, v_buf)
        layer.k_buf, layer.v_buf, layer.start, layer.end = k_buf, v_buf, start, end
        layer.rows = int(k_buf.shape[0])
        layer._publish()
        return layer

    @classmethod
    def holding_nothing(cls, margin: int) -> GrowingLayer:
        """A layer with no buffers yet (the running batch's, before its first rows)."""
        layer = cls()
        layer.margin = margin
        return layer

    @property
    def capacity(self) -> int:
        return 0 if self.k_buf is None else int(self.k_buf.shape[-2])

    @property
    def row_capacity(self) -> int:
        return 0 if self.k_buf is None else int(self.k_buf.shape[0])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `n` columns ([rows, H_kv, n, D]) in place; return the whole window."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.k_buf is None:
            self.rows = int(key_states.shape[0])
        n = key_states.shape[-2]
        if self.end + n > self.capacity:
            self.regrow(self.end - self.start + n, self.rows, template=key_states)
        self.k_buf[:self.rows, :, self.end:self.end + n].copy_(key_states)
        self.v_buf[:self.rows, :, self.end:self.end + n].copy_(value_states)
        self.end += n
        self._publish()
        return self.keys, self.values

    def regrow(self, columns: int, rows: int, template: torch.Tensor | None = None, left: int | None = None) -> None:
        """Replace the buffers by ones holding `rows` rows and `columns` columns from column `left` (default `margin`),
        each half again more than now where that is not enough; the window moves to start at `left`. Only the window
        is copied: every other column is written (or zeroed, `BatchKV.merge`) before it joins the window, so the
        new buffers need no zeroing."""
        like = self.k_buf if self.k_buf is not None else template
        left = self.margin if left is None else left
        right = max(0, self.capacity - self.start)  # what the window may use now, from its start
        cap = left + (right if columns <= right else _capacity(columns, right))
        row_cap = self.row_capacity
        if rows > row_cap:
            row_cap = rows if self.margin == 0 else _capacity(rows, row_cap, GROW_ROWS)
        k = like.new_empty((row_cap, like.shape[1], cap, like.shape[-1]))
        v = torch.empty_like(k)
        used = self.end - self.start
        if used and self.k_buf is not None:
            k[:self.rows, :, left:left + used].copy_(self.keys)
            v[:self.rows, :, left:left + used].copy_(self.values)
        self.k_buf, self.v_buf, self.start, self.end = k, v, left, left + used

    def _publish(self) -> None:
        self.keys = self.k_buf[:self.rows, :, self.start:self.end]  # [rows, H_kv, T, D]
        self.values = self.v_buf[:self.rows, :, self.start:self.end]


def _rows(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return t if index is None else t.index_select(0, index)


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

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s cached keys/values, per layer ([H_kv, L, D] copies of its real columns, in order)."""
        cols = self.mask[row].nonzero().squeeze(-1)
        return [(layer.keys[row].index_select(1, cols), layer.values[row].index_select(1, cols))
                for layer in self.cache.layers]

    def merge(self, cache: Any, mask: torch.Tensor, next_pos: torch.Tensor, index: torch.Tensor | None = None
              ) -> None:
        """Add freshly prefilled rows (their cache, mask [n, P], next positions [n]) to the batch: written into the
        buffers' spare rows, right-aligned with the window (into an empty batch, at `LEFT_MARGIN`); the buffers are
        replaced only when the rows, or the columns the window needs on the left or for the next step, do not fit.
        Columns that join the window are zeroed (padding must never be uninitialised memory: NaN times a zero
        attention weight is NaN). `index` [n]: new row i is row `index[i]` of `cache` (rows that shared a prompt's
        prefill); None = the cache's rows in order."""
        if self.cache is None:
            self.cache = _new_cache([GrowingLayer.holding_nothing(LEFT_MARGIN) for _ in cache.layers])
        n, new_t = int(mask.shape[0]), int(mask.shape[1])
        if self.rows == 0:
            for old, new in zip(self.cache.layers, cache.layers):
                if old.k_buf is None or n > old.row_capacity or old.margin + new_t + 1 > old.capacity:
                    old.lazy_initialization(new.keys, new.values)
                    old.start = old.end = 0
                    old.regrow(new_t + 1, n, template=new.keys)
                old.start, old.end, old.rows = old.margin, old.margin + new_t, n
                old.k_buf[:n, :, old.start:old.end].copy_(_rows(new.keys, index))
                old.v_buf[:n, :, old.start:old.end].copy_(_rows(new.values, index))
                old._publish()
            self.mask, self.next_pos = mask, next_pos
            return
        old_t = self.mask.shape[1]
        width = max(old_t, new_t)
        b = self.rows
        for old, new in zip(self.cache.layers, cache.layers):
            grow_left = width - old_t
            if b + n > old.row_capacity or grow_left > old.start or old.end + 1 > old.capacity:
                old.regrow(old_t + 1, b + n, left=max(old.margin, grow_left))
            if grow_left:
                old.start -= grow_left
                old.k_buf[:b, :, old.start:old.start + grow_left].zero_()
                old.v_buf[:b, :, old.start:old.start + grow_left].zero_()
            for buf, part in ((old.k_buf, new.keys), (old.v_buf, new.values)):
                buf[b:b + n, :, old.start:old.end - new_t].zero_()
                buf[b:b + n, :, old.end - new_t:old.end].copy_(_rows(part, index))
            old.rows = b + n
            old._publish()
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

    def compact(self, keep: list[int]) -> list[int]:
        """Keep only rows `keep` (ascending); returns the rows' new order (old indices). The last live rows move into
        the rows that finished (one row copy each); columns that are padding in every remaining row are trimmed."""
        if not keep:  # the buffers stay for the next rows
            self.mask, self.next_pos = self.mask[:0, :0], self.next_pos[:0]
            for layer in self.cache.layers:
                layer.rows, layer.start = 0, layer.end
                layer._publish()
            return []
        n = len(keep)
        kept = set(keep)
        holes = [i for i in range(n) if i not in kept]
        movers = [i for i in keep if i >= n]
        order = list(range(n))
        for h, m in zip(holes, movers):
            order[h] = m
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.mask.device)
            src = torch.tensor(movers, dtype=torch.long, device=self.mask.device)
            for layer in self.cache.layers:
                for buf in (layer.k_buf, layer.v_buf):
                    window = buf[:, :, layer.start:layer.end]
                    window[dst] = window[src]
        index = torch.tensor(order, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        real_cols = self.mask.any(0).nonzero()
        trim = int(real_cols[0]) if len(real_cols) else 0
        self.mask = self.mask[:, trim:]
        for layer in self.cache.layers:
            layer.rows, layer.start = n, layer.start + trim
            layer._publish()
        return order
