"""Forced choices (vLLM's `guided_choice` / `structured_outputs.choice`): each choice scored by the total logprob
of its tokens and the end of turn, given the prompt.

The prompt runs through the model once; each choice then continues from its keys/values a few tokens at a time,
and only the logprobs of the choice's own tokens are kept. Memory is one prompt's keys/values plus a
[piece, vocabulary] block of logits, whatever the number and length of the choices (a batch of every choice's
full-vocabulary logits grows with choices x length x vocabulary).
Left out: constrained generation (the choice is picked from the list, never generated), caching scores across
requests.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlfactory.serve.request import RequestError

PIECE_TOKENS = 16
"""Choice tokens run through the model per forward: the logits held at once are [PIECE_TOKENS, vocabulary]."""


def encode_choices(tokenizer: Any, choices: list[str], end_id: int, *, max_tokens: int) -> list[list[int]]:
    """Each choice's tokens + `end_id`, or a RequestError naming a choice longer than `max_tokens` tokens."""
    seqs = []
    for i, c in enumerate(choices):
        head = c[:max_tokens * 16]  # a long choice is refused from its start, without tokenizing all of it
        ids = tokenizer.encode(head, add_special_tokens=False)
        if len(head) < len(c) and len(ids) <= max_tokens + 2:  # +2: the cut may split what is one token in c
            ids = tokenizer.encode(c, add_special_tokens=False)
        if len(ids) > max_tokens:
            raise RequestError(f"choice {i} has {f'at least {len(ids) - 2}' if len(head) < len(c) else len(ids)} "
                               f"tokens; choices may have at most {max_tokens} tokens")
        seqs.append(list(ids) + [end_id])
    return seqs


def _croppable(cache: Any) -> bool:
    # Plain per-layer keys/values can be cut back to the prompt; other layers (sliding windows, linear attention's
    # running state) cannot, and the prompt is run again for each choice instead.
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def choice_logprobs(model: Any, prompt_ids: list[int], seqs: list[list[int]],
                    piece_tokens: int = PIECE_TOKENS) -> list[float]:
    """Total logprob of each token sequence in `seqs` as the continuation of `prompt_ids` (blocking)."""
    device = next(model.parameters()).device
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, P]

    def run_prompt() -> tuple[Any, torch.Tensor]:
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        return out.past_key_values, torch.log_softmax(out.logits[0, -1].float(), -1)  # cache, [V]

    totals: list[float] = []
    with torch.inference_mode():
        cache, first = run_prompt()
        reuse = _croppable(cache)
        for s in seqs:
            if totals and not reuse:
                cache, first = run_prompt()
            total = float(first[s[0]])
            for start in range(0, len(s) - 1, piece_tokens):  # tokens s[start:end] predict s[start + 1:end + 1]
                end = min(start + piece_tokens, len(s) - 1)
                inputs = torch.tensor([s[start:end]], dtype=torch.long, device=device)  # [1, k]
                targets = torch.tensor(s[start + 1:end + 1], dtype=torch.long, device=device)  # [k]
                logits = model(input_ids=inputs, past_key_values=cache, use_cache=True).logits[0].float()  # [k, V]
                total += float(torch.log_softmax(logits, -1).gather(1, targets[:, None]).sum())
                del logits
            if reuse:
                cache.crop(len(prompt_ids))
            totals.append(total)
    return totals


def pick(choices: list[str], scores: list[float], temperature: float, seed: int | None) -> str:
    """The best-scoring choice at temperature 0, else one sampled from softmax(scores / temperature)."""
    total = torch.tensor(scores)
    if temperature == 0:
        return choices[int(total.argmax())]
    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    return choices[int(torch.multinomial(torch.softmax(total / temperature, 0), 1, generator=gen))]
