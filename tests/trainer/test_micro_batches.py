"""`length_buckets`: micro-batches that cover every row once, cut where padded compute is least, with or without
prompt sharing (each distinct prompt of a micro-batch then costs its tokens once)."""
from __future__ import annotations

import random

from rlfactory.trainer.micro_batches import MICRO_BATCH_OVERHEAD_TOKENS, length_buckets


def _cost(buckets, lengths, prompt_of=None) -> float:
    total = 0.0
    for b in buckets:
        max_p, max_t = max(lengths[i][0] for i in b), max(lengths[i][1] for i in b)
        prompts = len(b) if prompt_of is None else len({prompt_of[i] for i in b})
        total += prompts * max_p + len(b) * max_t + MICRO_BATCH_OVERHEAD_TOKENS
    return total


def test_every_row_once_and_no_bucket_over_the_cap():
    rng = random.Random(0)
    lengths = [(rng.randint(10, 60), rng.randint(1, 200)) for _ in range(50)]
    prompt_of = [i // 8 for i in range(50)]
    rows = [i for i in range(50) if i % 7]
    for groups in (None, prompt_of):
        buckets = length_buckets(rows, lengths, 16, groups)
        assert sorted(i for b in buckets for i in b) == rows
        assert all(0 < len(b) <= 16 for b in buckets)
    assert length_buckets([], lengths, 16) == []


def test_short_and_long_rows_go_apart_and_the_split_is_the_cheapest():
    lengths = [(40, 5)] * 8 + [(40, 180)] * 8
    one = [list(range(16))]
    assert length_buckets(list(range(16)), lengths, 64) == [list(range(8)), list(range(8, 16))]
    assert _cost(length_buckets(list(range(16)), lengths, 64), lengths) < _cost(one, lengths)


def test_prompt_sharing_keeps_a_group_together_when_its_prompt_dominates():
    # two groups, long shared prompts, responses of two lengths in each: without sharing the lengths split the
    # rows; with sharing each prompt costs once a micro-batch, so splitting a group would pay for it twice
    lengths = [(300, 10), (300, 30)] * 4 + [(300, 12), (300, 28)] * 4
    prompt_of = [0] * 8 + [1] * 8
    shared = length_buckets(list(range(16)), lengths, 64, prompt_of)
    assert shared == [list(range(16))]
    brute = min(_cost([list(range(16))], lengths, prompt_of),
                _cost([list(range(8)), list(range(8, 16))], lengths, prompt_of))
    assert _cost(shared, lengths, prompt_of) == brute
