"""Train a tiny byte-level BPE tokenizer on rendered transcripts, for models trained from scratch (the CPU quickstart).

The result is an HF `PreTrainedTokenizerFast` that speaks the Qwen3 chat format exactly: the same special tokens
(`<|im_start|>`, `<|im_end|>`, `<tool_call>`, ...) as single ids and the same chat template as the real Qwen3
tokenizer, so the AgentLoop renders prompts and tool deltas for it the way it does for Qwen3.

Choices, and why:
- Digits are pre-split into single tokens, so a number is always spelled digit by digit and a small model can learn
  to copy operands and tool results.
- No pre-tokenizer regex: merges may span spaces and punctuation, so the long, repeated tool-schema text of the system
  turn compresses into a few tokens (the prompt stays short, which is what makes CPU training fast).
- Optionally (`environment_words`), every word the environment shows is one added token with its leading space, so
  that an item's name is the same tokens in the observation and in the policy's action (BabyAI's and TextCraft's
  policies copy names); the system turn's words are left to the merges, which keep it short. With `bare_words`
  the words, capitalised ones too, are added with the space and names (capitalised words) also without it,
  matching after any other character: the web's names are copied out of quotes and into brackets (`link 'Cobalt
  Alpine Mug'` -> `type [10] [Cobalt Alpine Mug]`), where only the first word stands after no space; with
  `name_space="trailing"` a name's words carry the space after them instead ("Cobalt ", "Alpine ", bare "Mug"),
  so the first word too is the same id in the intent and in the brackets. (Bare forms
  alone, the spaces then tokens of their own, put a space token between every two words of a name: a small model
  trained on those did not learn to copy names.)
- It is trained on fully rendered transcripts (chat template applied, tool schemas included), i.e. on exactly the
  text the model will see.

What it leaves out: any claim to be a general-purpose tokenizer. Text unlike the training transcripts still encodes
(byte-level fallback) but into many tokens.
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any, Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlfactory.models.tokenizer import attach_chat_template
from rlfactory.models.vision import vl_chat_template

logger = logging.getLogger(__name__)
_WORD = re.compile(r"(?<= )[a-z]+")
_BARE_WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z]+(?![A-Za-z0-9_])")

# Control tokens: special (skipped by `decode(skip_special_tokens=True)`), as in Qwen3.
CONTROL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Format tokens: single ids but kept by decode, as in Qwen3, because parsers read them from decoded text.
FORMAT_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<answer>", "</answer>",
)
# A vision-language policy's image tokens (Qwen-VL's), special as in Qwen: the placeholder run of an image sits
# between the start and end tokens (rlfactory/models/vision.py expands it).
VISION_TOKENS: tuple[str, ...] = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")


def _empty_byte_level_tokenizer(vision: bool = False) -> Any:
    """A byte-level BPE with no merges yet: digits split, no regex, Qwen's special tokens registered (and its image
    tokens with `vision`)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        # use_regex=False: no GPT-2 word splitting, so merges can span words (see the module docstring).
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in CONTROL_TOKENS + (VISION_TOKENS if vision else ())])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in FORMAT_TOKENS])
    return tok


def _wrap(tok: Any, model_max_length: int, vision: bool = False) -> Any:
    """Wrap a `tokenizers.Tokenizer` as an HF tokenizer with Qwen3's chat template (Qwen3-VL's with `vision`) and
    special-token roles."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",  # Qwen3 chat models end a turn (and generation) with <|im_end|>
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    attach_chat_template(hf)
    if vision:
        hf.chat_template = vl_chat_template()
    return hf


def render_transcripts(
    tokenizer: Any, transcripts: Iterable[dict[str, Any]], enable_thinking: bool = False
) -> list[str]:
    """Render each transcript (`{"messages": [...], "tools": [openai schemas]}`) with the chat template."""
    texts = []
    for t in transcripts:
        texts.append(tokenizer.apply_chat_template(
            _template_messages(t["messages"]), tools=t.get("tools") or None, tokenize=False,
            enable_thinking=enable_thinking,
        ))
    return texts


def _template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    # Demonstration transcripts keep the policy's raw text (tool calls inline), as rollouts do; the template only
    # needs role and content. Images are left out: their placeholders are special tokens, never merged.
    return [{"role": m["role"], "content": _text_of(m.get("content"))} for m in messages]


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def environment_words_of(transcripts: Sequence[dict[str, Any]], system_turn: str, min_count: int = 2,
                         bare: bool = False) -> list[str]:
    """Words (runs of lowercase letters after a space; `bare`: whole runs of letters, any case, after any character
    but a letter, digit or underscore) of the user and tool turns, seen `min_count` times, that the rendered
    `system_turn` does not contain; sorted."""
    pattern = _BARE_WORD if bare else _WORD
    counts: Counter[str] = Counter()
    for t in transcripts:
        for m in t["messages"]:
            if m.get("role") in ("user", "tool"):
                counts.update(pattern.findall(_text_of(m.get("content"))))
    in_system = set(re.findall(r"[A-Za-z]+" if bare else r"[a-z]+", system_turn))
    return sorted(w for w, n in counts.items() if n >= min_count and w not in in_system)


def build_tokenizer(
    transcripts: Sequence[dict[str, Any]],
    vocab_size: int = 640,
    model_max_length: int = 1024,
    min_frequency: int = 2,
    enable_thinking: bool = False,
    environment_words: bool = False,
    vision: bool = False,
    bare_words: bool = False,
    name_space: str = "leading",
) -> Any:
    """Train the tokenizer on rendered transcripts and return it as a `PreTrainedTokenizerFast`.

    `vocab_size` counts bytes, merges and special tokens; merges stop early when no pair occurs `min_frequency`
    times, so the result may be smaller. `environment_words`: the words of `environment_words_of` are added as
    whole tokens, each with its leading space, beyond `vocab_size` (`bare_words`: capitalised words too, and names
    also without it, for a name after a bracket or a quote; `name_space="trailing"`: names with the space after them
    instead, and bare, so a name is the same ids wherever it stands). `vision`: with Qwen-VL's image tokens and the
    Qwen3-VL chat template, for a vision-language policy.
    """
    if not transcripts:
        raise ValueError("build_tokenizer needs at least one transcript to train on")
    base = _empty_byte_level_tokenizer(vision)
    # Rendering needs only the template, not the vocabulary: render with the merge-less tokenizer, then train it.
    texts = render_transcripts(_wrap(base, model_max_length, vision), transcripts, enable_thinking=enable_thinking)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(CONTROL_TOKENS) + list(VISION_TOKENS if vision else ()) + list(FORMAT_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    base.train_from_iterator(texts, trainer=trainer)
    if environment_words:
        system_turn = texts[0].split("<|im_start|>user", 1)[0]
        words = environment_words_of(transcripts, system_turn, min_frequency, bare=bare_words)
        # Matched in the raw text before the merges, longest first: " redstone" is one token, not " red" + "stone".
        # Bare words come beside the spaced ones: " Alpine" after a space, "Cobalt" after a bracket or a quote, so a
        # copied name's words after its first are the same ids as the source's (what induction copying needs).
        # Bare forms for names only (capitalised, 3 letters or more): a bare "as" or "e" would split "Task" and "the".
        # `trailing`: "Cobalt " and "Alpine " (and bare "Mug" before a quote or a bracket), and no capitalised word
        # with a leading space (" C" would take the space and the C of " Cobalt": the leftmost match wins), so the
        # whole name, its first word too, is the same ids after a space, a quote or a bracket.
        names = [w for w in words if w[0].isupper() and len(w) >= 3] if bare_words else []
        if name_space == "trailing":
            forms = [" " + w for w in words if not w[0].isupper()] + [w + " " for w in names] + names
        else:
            forms = [" " + w for w in words] + names
        base.add_tokens([AddedToken(f, special=False, normalized=False) for f in forms])
        logger.info("tokenizer: %d environment words as whole tokens", len(words))
    hf = _wrap(base, model_max_length, vision)
    lengths = [len(hf(t, add_special_tokens=False)["input_ids"]) for t in texts[:256]]
    logger.info("tokenizer: vocab %d, transcript length %.1f tokens on average (%d sampled)",
                len(hf), sum(lengths) / len(lengths), len(lengths))
    return hf


def check_tokenizer(tokenizer: Any) -> list[str]:
    """Problems with a built tokenizer (empty list = fine): specials must be single ids, digits single tokens."""
    problems = []
    vision = VISION_TOKENS if VISION_TOKENS[-1] in tokenizer.get_vocab() else ()
    for t in CONTROL_TOKENS + vision + FORMAT_TOKENS:
        ids = tokenizer.encode(t, add_special_tokens=False)
        if len(ids) != 1:
            problems.append(f"{t} encodes to {len(ids)} ids, expected 1")
    ids = tokenizer.encode("x=4817*2931", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    if any(any(c.isdigit() for c in p) and len(p) > 1 for p in pieces):
        problems.append(f"digits are not single tokens: {pieces}")
    if not getattr(tokenizer, "chat_template", None):
        problems.append("no chat template attached")
    return problems
