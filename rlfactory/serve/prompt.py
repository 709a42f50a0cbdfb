"""A request's messages to prompt token ids: the chat template, then the tokenizer, with a bound on the work.

Both run on a worker thread (the server's event loop must keep answering while a multi-megabyte prompt is
rendered), and a prompt that cannot fit the model's context is refused from a prefix of its text, so a huge prompt
costs the tokenization of a few times the context, not of the whole text.
Rendering to text and encoding it without special tokens is what `apply_chat_template(tokenize=True)` does; doing
the two steps here keeps the tokenizer's own arguments out of the request's reach.
Left out: which template kwargs a request may pass (request.py).
"""
from __future__ import annotations

from typing import Any

from rlfactory.serve.request import RequestError

PREFIX_CHARS_PER_TOKEN = 8
"""A too-long prompt is first looked for in its first (context x this) characters: about twice the context in
tokens for ordinary text, so most oversized prompts are refused from one short tokenization."""


def _normalise_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # OpenAI clients send tool-call arguments as JSON strings; the template prints strings verbatim, which is right.
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):  # content parts: keep the text ones
            m["content"] = "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
        out.append(m)
    return out


def render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: dict[str, Any]) -> str:
    """The chat template's text for `messages` (+ `tools`), with the assistant turn opened."""
    try:
        text = tokenizer.apply_chat_template(_normalise_messages(messages), tools=tools or None,
                                             add_generation_prompt=True, tokenize=False, **template_kwargs)
    except Exception as e:  # a template error is the request's fault (bad roles, missing fields)
        raise RequestError(f"could not render the messages with the chat template: {e}") from e
    if not isinstance(text, str):
        raise RequestError(f"the chat template rendered {type(text).__name__}, not text")
    return text


def encode_within(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """`text`'s token ids, or a RequestError when they are more than `max_tokens`.

    A long text is tokenized by growing prefixes first: a prefix already well over `max_tokens` refuses the prompt.
    The slack allows for the prefix's last token differing from the whole text's tokens at that point."""
    slack = max_tokens // 8 + 16
    size = max(4096, max_tokens * PREFIX_CHARS_PER_TOKEN)
    while len(text) > size:
        counted = len(tokenizer.encode(text[:size], add_special_tokens=False))
        if counted > max_tokens + slack:
            raise RequestError(f"the prompt has more than {counted - slack} tokens (counted in its first {size:,} "
                               f"of {len(text):,} characters); the model's context is {max_tokens + 1}")
        size *= 4
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > max_tokens:
        raise RequestError(f"the prompt has {len(ids)} tokens; the model's context is {max_tokens + 1}")
    return list(ids)


def build_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 template_kwargs: dict[str, Any], max_context: int) -> list[int]:
    """Prompt ids leaving at least one token of room in `max_context` (blocking: run it on a worker thread)."""
    return encode_within(tokenizer, render_text(tokenizer, messages, tools, template_kwargs), max_context - 1)
