"""Question-answering rewards: normalised exact match, token F1 (SQuAD-style), substring containment.

Each reward reads the policy's answer out of its completion with `extract_answer` and compares it with the task's
reference `answer` (a string, a number, or a list of accepted aliases — the best alias counts).

Answer extraction: the text inside the LAST `<answer>...</answer>` tag of the whole completion wins (a model that
revises its answer is scored on the final one); without a tag, the final assistant turn with its `<think>` and
`<tool_call>` blocks removed is the answer.

Normalisation follows the SQuAD evaluation script: lower-case, drop punctuation (here: every Unicode punctuation
character, so "¿Qué?" and "Qué" match), drop the English articles a/an/the, collapse whitespace. Two answers that
both read as numbers ("1,000", "1000.0") are compared as numbers. Left out on purpose: stemming, synonyms, units.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Any

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BLOCK_RE = re.compile(r"<think>.*?</think>|<tool_call>.*?</tool_call>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_NUMBER_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def extract_answer(completion: str, final_response: str | None = None) -> str:
    """The answer the policy gave: the last `<answer>` tag's content, else the final turn without think/tool blocks."""
    tags = _ANSWER_RE.findall(completion or "")
    if tags:
        return tags[-1].strip()
    text = completion if final_response is None else final_response
    return _BLOCK_RE.sub("", text or "").strip()


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, no punctuation, no articles, single spaces."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def _as_number(text: str) -> float | None:
    # Thousands separators are dropped before the match, so "1,000" == "1000"; "3/4" is not a number here.
    candidate = str(text).strip().replace(",", "").replace("_", "")
    if _NUMBER_RE.fullmatch(candidate):
        return float(candidate)
    return None


def _aliases(answer: Any) -> list[str]:
    if answer is None:
        raise ValueError("the task has no reference 'answer' (add an `answer` column to the data)")
    if isinstance(answer, (list, tuple, set)):
        if not answer:
            raise ValueError("the task's reference 'answer' is an empty list")
        return [str(a) for a in answer]
    return [str(answer)]


def _exact(pred: str, ref: str) -> bool:
    p, r = _as_number(pred), _as_number(ref)
    if p is not None and r is not None:
        return p == r
    return normalize_answer(pred) == normalize_answer(ref)


def _token_f1(pred: str, ref: str) -> float:
    pred_tokens, ref_tokens = normalize_answer(pred).split(), normalize_answer(ref).split()
    if not pred_tokens or not ref_tokens:
        # SQuAD's rule: two empty answers agree; an empty answer against a non-empty one scores 0.
        return float(pred_tokens == ref_tokens)
    common = Counter(pred_tokens) & Counter(ref_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(completion: str, answer: Any, final_response: str | None = None) -> float:
    """1.0 if the extracted answer equals a reference alias after normalisation (or numerically), else 0.0."""
    pred = extract_answer(completion, final_response)
    return float(any(_exact(pred, ref) for ref in _aliases(answer)))


def f1(completion: str, answer: Any, final_response: str | None = None) -> float:
    """Token-level F1 between the extracted answer and the best reference alias (0.0 to 1.0)."""
    pred = extract_answer(completion, final_response)
    return max(_token_f1(pred, ref) for ref in _aliases(answer))


def contains(completion: str, answer: Any, final_response: str | None = None, whole_words: bool = True) -> float:
    """1.0 if a normalised reference alias occurs inside the normalised extracted answer.

    `whole_words` (default) matches on word boundaries, so "4" is not found in "14"; an empty reference never counts.
    """
    pred = normalize_answer(extract_answer(completion, final_response))
    for ref in _aliases(answer):
        ref_n = normalize_answer(ref)
        if not ref_n:
            continue
        if (f" {ref_n} " in f" {pred} ") if whole_words else (ref_n in pred):
            return 1.0
    return 0.0
