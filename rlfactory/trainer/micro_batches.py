"""How a mini-batch's rows are cut into micro-batches for the update (`length_buckets`).

The gradient does not depend on the split (losses are normalised by the whole mini-batch); only how much padding
is computed does. A micro-batch costs its rows times its longest response, plus its prompts times its longest
prompt: every row's prompt without prompt sharing, each distinct prompt once with it
(`algorithm.shared_prompt_forward`, `grpo.response_logprobs`), plus a fixed cost per forward/backward call.
"""
from __future__ import annotations

MICRO_BATCH_OVERHEAD_TOKENS = 256
"""What one more micro-batch costs, in padded tokens of forward/backward (measured on CPU for the quickstart's model:
~10-20 ms of fixed cost against ~70 us a token)."""


def length_buckets(rows: list[int], lengths: list[tuple[int, int]], max_rows: int,
                   prompt_of: list[int] | None = None) -> list[list[int]]:
    """Split `rows` into micro-batches of at most `max_rows` rows with the least padded compute. `lengths[i]` is
    row i's real (prompt, response) length; `prompt_of[i]`, when given, names row i's prompt (rows naming the same
    one share its forward pass). Rows are sorted by length and cut where the total cost is smallest (exact, by
    dynamic programming over the sorted rows)."""
    if not rows:
        return []
    if prompt_of is None:
        order = sorted(rows, key=lambda i: (lengths[i][0] + lengths[i][1], i))
    else:  # prompts are computed once a micro-batch: what the rows add is their responses
        order = sorted(rows, key=lambda i: (lengths[i][1], prompt_of[i], i))
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        max_p = max_t = 0
        prompts: set[int] = set()
        for i in range(j - 1, max(j - max_rows, 0) - 1, -1):  # the last micro-batch is order[i:j]
            row = order[i]
            max_p = max(max_p, lengths[row][0])
            max_t = max(max_t, lengths[row][1])
            if prompt_of is None:
                tokens = (j - i) * (max_p + max_t)
            else:
                prompts.add(prompt_of[row])
                tokens = len(prompts) * max_p + (j - i) * max_t
            cost = best[i] + tokens + MICRO_BATCH_OVERHEAD_TOKENS
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], n
    while j > 0:
        out.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return out[::-1]
