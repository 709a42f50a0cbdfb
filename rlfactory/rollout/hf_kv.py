"""`BatchKV`: the running batch's KV cache, attention mask and positions for continuous batching in `HFEngine`.

Rows are left-padded: every row's cached tokens end at the same column, so one decode step appends one column for
all rows. New rows are prefilled on their own and merged in by left-padding whichever side is shorter; finished
rows are dropped and all-padding columns on the left trimmed. Padded columns carry attention-mask 0, so their
(zero) keys/values never contribute. RoPE positions are tracked per row (count of real tokens), not per column.
Left out: paged/block memory management; this is for small batches on CPU or one GPU.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _new_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    from transformers import DynamicCache  # noqa: PLC0415

    return DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]  # each [B, H_kv, T, D]


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

    def merge(self, cache: Any, mask: torch.Tensor, next_pos: torch.Tensor) -> None:
        """Add freshly prefilled rows (their cache, mask [n, P], next positions [n]) to the batch."""
        if self.cache is None:
            self.cache, self.mask, self.next_pos = cache, mask, next_pos
            return
        old_t, new_t = self.mask.shape[1], mask.shape[1]
        width = max(old_t, new_t)
        merged = []
        for (k_old, v_old), (k_new, v_new) in zip(_layers(self.cache), _layers(cache)):
            merged.append((
                torch.cat([_pad_left(k_old, width - old_t), _pad_left(k_new, width - new_t)], dim=0),
                torch.cat([_pad_left(v_old, width - old_t), _pad_left(v_new, width - new_t)], dim=0),
            ))
        self.cache = _new_cache(merged)
        self.mask = torch.cat([F.pad(self.mask, (width - old_t, 0)), F.pad(mask, (width - new_t, 0))], dim=0)
        self.next_pos = torch.cat([self.next_pos, next_pos])

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask [B, T+1] and positions [B, 1] for feeding one new token per row."""
        ones = torch.ones((self.rows, 1), dtype=self.mask.dtype, device=self.mask.device)
        self._step_mask = torch.cat([self.mask, ones], dim=1)
        return self._step_mask, self.next_pos[:, None]

    def advance(self) -> None:
        """The step's tokens are now cached."""
        self.mask, self._step_mask = self._step_mask, None
        self.next_pos = self.next_pos + 1

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in order); trim columns that are padding in every remaining row."""
        if not keep:
            self.cache = self.mask = self.next_pos = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        real_cols = self.mask.any(0).nonzero()
        start = int(real_cols[0]) if len(real_cols) else 0
        self.mask = self.mask[:, start:]
        self.cache = _new_cache([
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in _layers(self.cache)
        ])


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """Zero-pad a [B, H, T, D] cache tensor by n columns on the left of T."""
    return F.pad(t, (0, 0, n, 0)) if n else t
