"""`ParkedKV`: the KV cache of finished requests, kept so that the next turn of the same conversation skips
re-prefilling what it already holds (the HF engine's prefix cache, `HFEngine(prefix_cache=True)`).

A multi-turn rollout asks for turn t+1 with the prompt of turn t, its output and the tool response appended. When
turn t's row leaves the running batch, its keys/values (every token but the last sampled one, which was never fed)
are parked here under those token ids. A new request whose prompt starts with a parked entry's tokens takes the
entry (it is removed: a conversation moves on) and prefills only the rest. Entries carry a key for the weights
that computed them (`HFEngine._weights_key`); a lookup under another key drops them.
At most `max_tokens` tokens are parked; the least recently parked go first.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Parked:
    tokens: tuple[int, ...]
    """The token ids whose keys/values are held, in order."""
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    """Per layer: keys and values, each [H_kv, len(tokens), D]."""
    key: int
    """The weights that computed them (see `HFEngine._weights_key`)."""

    def continued_by(self, prompt: list[int]) -> bool:
        """Whether `prompt` goes on from these tokens (they are a proper prefix of it)."""
        n = len(self.tokens)
        return 0 < n < len(prompt) and prompt[n - 1] == self.tokens[-1] and tuple(prompt[:n]) == self.tokens


class ParkedKV:
    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, Parked] = OrderedDict()
        self._next = 0
        self.tokens = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def park(self, entry: Parked) -> None:
        if len(entry.tokens) > self.max_tokens:
            return
        self._entries[self._next] = entry
        self._next += 1
        self.tokens += len(entry.tokens)
        while self.tokens > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self.tokens -= len(old.tokens)

    def take(self, prompt: list[int], key: int) -> Parked | None:
        """The longest entry computed by weights `key` that is a proper prefix of `prompt` (removed from the store),
        or None. Entries of other weights are dropped."""
        stale = [k for k, e in self._entries.items() if e.key != key]
        for k in stale:
            self.tokens -= len(self._entries.pop(k).tokens)
        best_key, best_len = None, 0
        for k, e in self._entries.items():
            n = len(e.tokens)
            if n > best_len and e.continued_by(prompt):
                best_key, best_len = k, n
        if best_key is None:
            return None
        entry = self._entries.pop(best_key)
        self.tokens -= best_len
        self.hits += 1
        self.hit_tokens += best_len
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0


def shared_past(taken: list[Any], prompt: list[int]) -> Parked | None:
    """A parked entry another request of this admission (`taken`: requests with a `past`) took that `prompt`
    continues too (the branches of a branched group ask for their root's conversation at once: its keys/values are
    read, never written, so they serve every branch)."""
    return next((r.past for r in taken if r.past is not None and r.past.continued_by(prompt)), None)
