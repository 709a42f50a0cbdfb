"""The offline Qwen3 tokenizer: known ids, agreement with tiktoken on the same ranks, caching, the chat template."""
from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfactory.models.tokenizer import (
    QWEN3_ADDED_TOKENS,
    QWEN_PRETOKENIZE_REGEX,
    attach_chat_template,
    load_qwen_tokenizer,
    qwen_tiktoken_path,
)

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]

TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": '
    '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}'
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


@pytest.fixture(scope="module")
def reference():
    """tiktoken itself on qwen-agent's ranks with Qwen's regex: the encoding our HF build must reproduce."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    return tiktoken.Encoding(
        name="qwen-reference", pat_str=QWEN_PRETOKENIZE_REGEX,
        mergeable_ranks=load_tiktoken_bpe(str(qwen_tiktoken_path())),
        special_tokens={content: token_id for token_id, content, _ in QWEN3_ADDED_TOKENS},
    )


def test_known_ids(qwen_tokenizer):
    tok = qwen_tokenizer
    assert tok.encode("Hello, world") == [9707, 11, 1879]
    assert tok.encode("<tool_call>") == [151657]
    assert len(tok) == 151_669
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151643)
    for token_id, content, _ in QWEN3_ADDED_TOKENS:
        assert tok.encode(content) == [token_id], content
        assert tok.decode([token_id]) == content


def test_special_flags_match_qwen3(qwen_tokenizer):
    # Qwen3 marks control tokens special (dropped by skip_special_tokens) but keeps tool/think tags as text.
    ids = qwen_tokenizer.encode(
        "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>")


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over 12345 lazy dogs!",
    "  leading spaces\n\n\ttabs and\r\nwindows newlines   ",
    "日本語のテキストと中文混合 text, émojis 🤖🚀 and accents: café naïve",
    'def f(x):\n    return {"a": [1, 2.5e-3]}  # code\n',
    "<|im_start|>user\nWhat's 2+2? I'll check, you've said we'd<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
])
def test_agrees_with_tiktoken_and_round_trips(qwen_tokenizer, reference, text):
    ids = qwen_tokenizer.encode(text)
    assert ids == reference.encode(text, allowed_special="all")
    assert qwen_tokenizer.decode(ids) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_random_text_agrees_with_tiktoken(qwen_tokenizer, reference, text):
    text = unicodedata.normalize("NFC", text)  # the HF build NFC-normalises, as Qwen's tokenizer.json does
    ids = qwen_tokenizer.encode(text)
    assert ids == reference.encode(text, allowed_special="all")
    assert qwen_tokenizer.decode(ids) == text


def test_disk_cache_round_trip(tmp_path):
    from rlfactory.models import tokenizer as module

    built = load_qwen_tokenizer(tmp_path / "tok")
    assert (tmp_path / "tok" / "tokenizer.json").exists()
    assert load_qwen_tokenizer(tmp_path / "tok") is built  # shared within the process
    module._LOADED.pop(tmp_path / "tok")
    cached = load_qwen_tokenizer(tmp_path / "tok")  # read back from disk
    assert cached is not built
    text = "<|im_start|>user\nHello, world 42 日本<|im_end|>"
    assert cached.encode(text) == built.encode(text)
    assert cached.chat_template == built.chat_template


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_template_tools_in_system_turn(qwen_tokenizer):
    text = render(qwen_tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"}],
                  tools=TOOLS, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK
        + "<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n")
    no_system = render(qwen_tokenizer, [{"role": "user", "content": "1+2?"}], tools=TOOLS)
    assert no_system == "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_start|>user\n1+2?<|im_end|>\n"
    plain = render(qwen_tokenizer, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert plain == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"


def test_template_tool_calls_and_grouped_responses(qwen_tokenizer):
    messages = [
        {"role": "user", "content": "1+2 and 3+4?"},
        {"role": "assistant", "content": "<think>\nTwo sums.\n</think>\n\nCalling.", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "7"},
    ]
    assert render(qwen_tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>user\n1+2 and 3+4?<|im_end|>\n"
        # after the last user query, so the reasoning is kept
        "<|im_start|>assistant\n<think>\nTwo sums.\n</think>\n\nCalling.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    # A call with no content starts right after the role line.
    bare = render(qwen_tokenizer, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                  "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1}}}]}])
    assert bare.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "add", '
                         '"arguments": {"a": 1}}\n</tool_call><|im_end|>\n')


def test_template_drops_think_before_last_query(qwen_tokenizer):
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nanswer one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "<think>\nnew thoughts\n</think>\n\nanswer two"},
    ]
    assert render(qwen_tokenizer, messages) == (
        "<|im_start|>user\nfirst<|im_end|>\n<|im_start|>assistant\nanswer one<|im_end|>\n"
        "<|im_start|>user\nsecond<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\nanswer two<|im_end|>\n")


def test_template_enable_thinking_switch(qwen_tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    on = render(qwen_tokenizer, messages, add_generation_prompt=True)
    off = render(qwen_tokenizer, messages, add_generation_prompt=True, enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    ids = qwen_tokenizer.encode(off)
    assert ids[-7:-4] == [151644, 77091, 198]  # <|im_start|> assistant \n
    assert 151667 in ids[-4:] and 151668 in ids[-4:]  # <think> ... </think> as single ids


def test_attach_chat_template_to_a_tiny_trained_tokenizer(qwen_tokenizer):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>", "<think>", "</think>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(["user assistant system tool call add numbers 1 2 3"] * 20,
                                trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    tiny = attach_chat_template(PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>"))
    messages = [{"role": "user", "content": "add 1 2"}, {"role": "tool", "content": "3"}]
    assert render(tiny, messages, tools=TOOLS) == render(qwen_tokenizer, messages, tools=TOOLS)
