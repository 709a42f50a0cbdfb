"""Cutting an over-long tool response to a token budget, on its TEXT, before the chat template wraps it.

Truncating text (not the template's token delta) keeps `</tool_response>` and `<|im_end|>` intact, so the model
always sees a well-formed turn. The budget counts the tokens of the text alone, including a short note saying how
much was cut; decoding a cut can split a multi-byte character, so the result is re-encoded and shrunk until it fits.

Left out: summarising long outputs (a tool's job) and character-based limits (`format.response_text`).
"""
from __future__ import annotations

from typing import Callable, Literal

Side = Literal["left", "right", "middle"]

_REPLACEMENT = "\ufffd"


WINDOW_CHARS_PER_TOKEN = 32
"""A text longer than (budget + 64) x this many characters is tokenized only in windows at the ends it keeps, and the
count of tokens cut is estimated from the windows' characters per token: 64 KiB of binary output took 83 ms to
tokenize whole, on the event loop, to keep 64 tokens of it. (A window that holds too few tokens, whose tokens are
very long, falls back to the whole text.)"""


def _note(cut: int, approx: bool = False) -> str:
    return f"\n[... {'about ' if approx else ''}{cut} tokens truncated ...]\n"


def _windowed_ids(text: str, max_tokens: int, side: Side, encode: Callable[[str], list[int]]
                  ) -> tuple[list[int], int, bool]:
    """(ids to cut from, the text's token count, whether that count is an estimate)."""
    width = (max_tokens + 64) * WINDOW_CHARS_PER_TOKEN
    if len(text) > 2 * width:
        window = text[:width] if side == "right" else text[-width:] if side == "left" else (
            text[:width] + text[-width:])  # middle: the seam lies in the part that is cut
        ids = encode(window)
        if len(ids) > max_tokens + 32:
            return ids, round(len(ids) * len(text) / len(window)), True
    ids = encode(text)
    return ids, len(ids), False


def truncate_tokens(
    text: str,
    max_tokens: int,
    side: Side,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> tuple[str, int]:
    """`text` cut to at most `max_tokens` tokens (as `encode` counts them). Returns (text, tokens cut).

    `right` keeps the start, `left` keeps the end, `middle` keeps both ends. A note with the number of tokens cut
    replaces the removed part when it fits in the budget.
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    ids, total, approx = _windowed_ids(text, max_tokens, side, encode)
    if total <= max_tokens:
        return text, 0
    cut_estimate = total - max_tokens
    note = _note(cut_estimate, approx)
    note_len = len(encode(note))
    if note_len >= max_tokens:
        note, note_len = "", 0
    keep = max_tokens - note_len
    while True:
        candidate = _assemble(ids, keep, side, note, decode)
        size = len(encode(candidate))
        if size <= max_tokens or keep <= 0:
            break
        keep -= size - max_tokens  # re-encoding merged or split tokens at the seams: shrink and retry
    if len(encode(candidate)) > max_tokens:  # even the note alone is too long at this budget
        candidate = ""
    return candidate, total - max(0, keep)


def _assemble(ids: list[int], keep: int, side: Side, note: str, decode: Callable[[list[int]], str]) -> str:
    keep = max(0, keep)
    if side == "right":
        return decode(ids[:keep]).rstrip(_REPLACEMENT) + note
    if side == "left":
        return note + decode(ids[len(ids) - keep:] if keep else []).lstrip(_REPLACEMENT)
    if side == "middle":
        head, tail = keep - keep // 2, keep // 2
        return (decode(ids[:head]).rstrip(_REPLACEMENT) + note
                + decode(ids[len(ids) - tail:] if tail else []).lstrip(_REPLACEMENT))
    raise ValueError(f"truncation side must be left, right or middle, got {side!r}")
