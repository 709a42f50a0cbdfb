"""BatchKV / GrowingLayer: decode steps write into spare columns in place, joining rows go into spare rows, finished
rows are replaced by the last live ones, and through all of it every row's keys/values equal plain concatenation
(padding columns zero, aligned with the attention mask)."""
from __future__ import annotations

import random

import torch

from rlfactory.rollout.engines.hf_kv import GROW_COLUMNS, LEFT_MARGIN, BatchKV, GrowingLayer

LAYERS, HEADS, DIM = 2, 2, 4


def test_steps_write_in_place_until_the_buffer_is_full():
    layer = GrowingLayer()
    pieces = [torch.randn(3, HEADS, 5, DIM)]
    keys, _ = layer.update(pieces[0], pieces[0] * 2)
    assert layer.capacity == GROW_COLUMNS and keys.shape == (3, HEADS, 5, DIM)
    first = layer.k_buf.data_ptr()
    for _ in range(GROW_COLUMNS - 5):
        pieces.append(torch.randn(3, HEADS, 1, DIM))
        layer.update(pieces[-1], pieces[-1] * 2)
        assert layer.k_buf.data_ptr() == first  # no new tensor per step
    pieces.append(torch.randn(3, HEADS, 1, DIM))
    keys, values = layer.update(pieces[-1], pieces[-1] * 2)
    assert layer.capacity == 2 * GROW_COLUMNS  # half again, rounded up to whole chunks
    expected = torch.cat(pieces, dim=-2)
    assert torch.equal(keys, expected) and torch.equal(values, expected * 2)
    assert layer.get_seq_length() == GROW_COLUMNS + 1


def _check(batch: BatchKV, rows: list[list[torch.Tensor]]) -> None:
    """rows[i]: row i's real key columns ([HEADS, DIM] each), oldest first; values are keys * 2 in this test."""
    assert batch.mask.shape[0] == len(rows)
    assert bool(batch.mask[:, 0].any())  # no all-padding column on the left
    for layer_idx, layer in enumerate(batch.cache.layers):
        assert layer.keys.shape[:3] == (len(rows), HEADS, batch.mask.shape[1])
        for i, cols in enumerate(rows):
            real = batch.mask[i].bool()
            assert int(real.sum()) == len(cols)
            assert bool(real[-len(cols):].all())  # left-padded: real tokens end at the last column
            want = torch.stack(cols, dim=1) + layer_idx  # [HEADS, T_i, DIM]
            assert torch.equal(layer.keys[i][:, real], want)
            assert torch.equal(layer.values[i][:, real], want * 2)
            assert not bool(layer.keys[i][:, ~real].any())  # padding columns are zero, never garbage
        assert torch.equal(batch.next_pos, torch.tensor([len(c) for c in rows]))


def test_merges_steps_and_evictions_match_concatenation():
    rng = random.Random(0)
    batch, rows = BatchKV(pad_token_id=0), []
    for _ in range(60):
        op = rng.random()
        if op < 0.2 or not rows:  # admit a few prompts of different lengths
            lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 3))]
            cols = [[torch.randn(HEADS, DIM) for _ in range(n)] for n in lengths]
            _, mask, positions = batch.left_pad([[1] * n for n in lengths], torch.device("cpu"))
            cache = batch.new_cache()
            width = mask.shape[1]
            keys = torch.zeros(len(lengths), HEADS, width, DIM)
            for i, c in enumerate(cols):
                keys[i, :, width - len(c):] = torch.stack(c, dim=1)
            for layer_idx in range(LAYERS):
                padded = (keys + layer_idx) * mask[:, None, :, None]  # prefill writes zeros where the mask is 0
                cache.update(padded, padded * 2, layer_idx)
            batch.merge(cache, mask, positions[:, -1] + 1)
            rows += cols
        elif op < 0.35 and len(rows) > 1:  # some rows finish
            keep = sorted(rng.sample(range(len(rows)), rng.randint(1, len(rows) - 1)))
            order = batch.compact(keep)
            assert sorted(order) == keep
            assert all(order[j] == j for j in range(len(keep)) if j in keep)  # only rows past the end move
            rows = [rows[i] for i in order]
        else:  # a decode step for every row
            batch.step_inputs()
            new = [torch.randn(HEADS, DIM) for _ in rows]
            col = torch.stack(new)[:, :, None, :]  # [B, HEADS, 1, DIM]
            for layer_idx in range(LAYERS):
                batch.cache.update(col + layer_idx, (col + layer_idx) * 2, layer_idx)
            batch.advance()
            for r, c in zip(rows, new):
                r.append(c)
        _check(batch, rows)


def test_a_long_decode_reallocates_only_when_full():
    batch = BatchKV(pad_token_id=0)
    _, mask, positions = batch.left_pad([[1] * 10, [1] * 3], torch.device("cpu"))
    cache = batch.new_cache()
    cache.update(torch.zeros(2, HEADS, 10, DIM), torch.zeros(2, HEADS, 10, DIM), 0)
    batch.merge(cache, mask, positions[:, -1] + 1)
    seen = []  # (capacity, buffer address) after each step
    for _ in range(400):
        batch.step_inputs()
        batch.cache.update(torch.ones(2, HEADS, 1, DIM), torch.ones(2, HEADS, 1, DIM), 0)
        batch.advance()
        layer = batch.cache.layers[0]
        seen.append((layer.capacity, layer.k_buf.data_ptr()))
    changes = [b for a, b in zip(seen, seen[1:]) if a != b]
    # a new buffer only when the old one is full, each half again larger, with the free margin on the left
    assert [c - LEFT_MARGIN for c, _ in changes] == [256, 384, 640]


def _prefilled(batch: BatchKV, lengths: list[int], fill: float) -> tuple:
    _, mask, positions = batch.left_pad([[1] * n for n in lengths], torch.device("cpu"))
    cache = batch.new_cache()
    keys = torch.full((len(lengths), HEADS, mask.shape[1], DIM), fill) * mask[:, None, :, None]
    cache.update(keys, keys, 0)
    return cache, mask, positions[:, -1] + 1


def test_rows_join_and_leave_in_place():
    batch = BatchKV(pad_token_id=0)
    batch.merge(*_prefilled(batch, [12, 5], 1.0))
    batch.merge(*_prefilled(batch, [3], 2.0))  # rows 2..: the buffers' row capacity grows once, by half again
    layer = batch.cache.layers[0]
    buf, rows_cap = layer.k_buf.data_ptr(), layer.row_capacity
    assert rows_cap >= 4
    batch.merge(*_prefilled(batch, [7], 3.0))  # fits the spare rows and the window: written in place
    assert layer.k_buf.data_ptr() == buf and batch.rows == 4
    batch.merge(*_prefilled(batch, [12 + LEFT_MARGIN // 2], 4.0))  # longer than the window: it grows left in place
    assert batch.cache.layers[0].k_buf.data_ptr() == buf and batch.mask.shape[1] == 12 + LEFT_MARGIN // 2
    order = batch.compact([0, 2, 4])  # rows 1 and 3 finished: row 4 moves into row 1
    assert order == [0, 4, 2]
    layer = batch.cache.layers[0]
    assert layer.k_buf.data_ptr() == buf
    real = batch.mask.bool()
    for i, fill in enumerate([1.0, 4.0, 2.0]):
        assert bool((layer.keys[i][:, real[i]] == fill).all()) and not bool(layer.keys[i][:, ~real[i]].any())
    assert bool(batch.mask[:, 0].any())  # trimmed: no all-padding column on the left
    assert batch.compact([]) == [] and batch.rows == 0  # the batch empties; its buffers stay for the next rows
    batch.merge(*_prefilled(batch, [9], 5.0))
    layer = batch.cache.layers[0]
    assert layer.k_buf.data_ptr() == buf and batch.rows == 1 and bool((layer.keys[0] == 5.0).all())
