"""`ChatFormat`: the token ids the chat template puts around the policy's turns, computed so earlier tokens never
change.

The prompt is the template's rendering of the task's messages (tools in the system turn, generation prompt at the
end). Everything after that is built as a token DELTA: the policy's own tokens are appended as generated, and each
tool turn adds exactly the tokens the template places after an assistant turn that ended with `<|im_end|>`, up to
and including the next generation prompt (`<|im_start|>assistant\n`, plus the empty think block when thinking is
off). Deltas are computed against a fixed dummy history, never the real one: Qwen3's template rewrites earlier
assistant turns (it drops their `<think>` blocks), so re-rendering the real history would change tokens the policy
already produced.

Images (a vision-language policy's tokenizer carries a `VisionProcessor`, models/vision.py): a message's content may
be a list of parts, `{"type": "image", "image": sha256}` among them; the template renders each image as one
`<|image_pad|>` between `<|vision_start|>` and `<|vision_end|>`, and `prompt_ids` / `tool_response_delta` expand that
pad to the image's token count, given the images in order. Pads in text from outside are broken by `neutralize`
like any markup, so only the template's pads are expanded.

Left out: parsing tool calls (`rlfactory.tools.format`), truncating tool text (`agent_loop`), and building image parts
(`images.py`); `decode` is for viewing only and its output is never re-encoded into a trajectory.
"""
from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from typing import Any

from rlfactory.envs.protocol import hide_episode_arg
from rlfactory.models.vision import vision_of
from rlfactory.tools.types import ToolImage

logger = logging.getLogger(__name__)

PROMPT_CACHE_SIZE = 1024
"""Rendered prompts kept per ChatFormat: a GRPO group's samples (and every epoch's repeat) share one rendering."""

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ZWSP = "\u200b"
"""What `ChatFormat.neutralize` puts inside markup found in outside text."""
TOOL_CALL_END = "</tool_call>"
END_OF_TEXT = "<|endoftext|>"

# A marker no real conversation contains: the delta starts right after the `<|im_end|>` that closes it.
_DUMMY_ASSISTANT = "rlfactory-dummy-assistant-turn"
_DUMMY_USER = "rlfactory-dummy-user-turn"


class ChatFormat:
    """Token-level chat format for one policy: prompt ids, tool-turn deltas, stop tokens."""

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        *,
        enable_thinking: bool = False,
        system_prompt: str | None = None,
        stop_at_tool_call_end: bool = False,
    ):
        """`tools` are OpenAI function schemas (`ToolSpec.to_openai()`), rendered by the template into the system
        turn without any `episode_id` parameter. `stop_at_tool_call_end` also stops generation after `</tool_call>`
        (the turn is then closed with a template `<|im_end|>` that is not a policy token)."""
        self.tokenizer = tokenizer
        # Environment tools take an `episode_id` the loop fills in (rlfactory/envs/protocol.py): never shown.
        self.tools = [hide_episode_arg(t) for t in tools or []]
        self.enable_thinking = enable_thinking
        self.system_prompt = system_prompt
        self.stop_at_tool_call_end = stop_at_tool_call_end
        self.vision = vision_of(tokenizer)
        """The policy's image processor; None for a text-only policy (images then reach it as a note, images.py)."""
        self._prompt_cache: OrderedDict[str, list[int]] = OrderedDict()
        self._delta_tools: bool | None = None if self.tools else False
        """Whether tool-turn deltas must be rendered with the tool schemas (None: not known until the first one)."""
        self.im_end_id = self._single_token_id(IM_END)
        self._im_end_text_len = len(IM_END)
        eot = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
        self._extra_stop_ids = [eot] if isinstance(eot, int) and eot != tokenizer.unk_token_id else []
        self.tool_call_end_id = self._single_token_id(TOOL_CALL_END) if stop_at_tool_call_end else None
        self.turn_end_ids = frozenset([self.im_end_id, *self._extra_stop_ids])
        """Special tokens that close a turn (left out of a turn's text; `</tool_call>` is text and stays)."""
        # The generation prompt alone (e.g. "<|im_start|>assistant\n" or with "<think>\n\n</think>\n\n"): its
        # tokens end every delta, so callers can check a delta or count its overhead.
        self.generation_prompt_ids = self.tool_response_delta([])[1:]
        # Markup only: added tokens that are words (a built tokenizer's environment words, " cobblestone") are text.
        markup = sorted((t for t in tokenizer.get_added_vocab() if len(t) > 1 and not t.strip().isalpha()),
                        key=len, reverse=True)
        self._markup = re.compile("|".join(map(re.escape, markup))) if markup else None

    def neutralize(self, text: str) -> str:
        """`text` with each added-token string in it (`<|im_end|>`, `<|im_start|>`, `<tool_call>`, `</tool_response>`,
        `<think>`…) broken by a zero-width space after its first character, so that text from outside (tool output,
        an environment's observation) is read as text and never as chat-template markup. A tool could otherwise end
        its own response and start a fake turn. Idempotent."""
        if self._markup is None or not text:
            return text
        return self._markup.sub(lambda m: m.group(0)[0] + ZWSP + m.group(0)[1:], text)

    # ---- token ids -------------------------------------------------------------------------------------------
    def _single_token_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"the tokenizer encodes {token!r} as {len(ids)} tokens; a Qwen-style chat tokenizer with it as a "
                "special token is needed (rlfactory.rollout.tokenizer.load_qwen_tokenizer)"
            )
        return ids[0]

    def encode(self, text: str) -> list[int]:
        """Plain text to ids (no BOS/EOS added); special-token strings in `text` map to their single ids."""
        # verbose=False: a long tool output is cut to its budget afterwards; no "sequence too long" warning
        return list(self.tokenizer.encode(text, add_special_tokens=False, verbose=False))

    @classmethod
    def for_rollout(cls, tokenizer: Any, tools: list[dict[str, Any]] | None, rollout: Any) -> "ChatFormat":
        """The chat format a recipe's rollouts generate with: its `rollout:` section's thinking switch, system
        prompt and `stop_at_tool_call_end` (training, evaluation and the warm-start check alike)."""
        return cls(tokenizer, tools, enable_thinking=rollout.enable_thinking, system_prompt=rollout.system_prompt,
                   stop_at_tool_call_end=rollout.stop_at_tool_call_end)

    def decode(self, ids: list[int]) -> str:
        """Ids to text, special tokens kept. For viewing, rewards and parsing only: never re-encode the result."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end an assistant turn: `<|im_end|>`, `<|endoftext|>` and optionally `</tool_call>`."""
        ids = [self.im_end_id, *self._extra_stop_ids]
        if self.tool_call_end_id is not None:
            ids.append(self.tool_call_end_id)
        return ids

    # ---- rendering -------------------------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, with_tools: bool = True) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self.tools and with_tools:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(messages, enable_thinking=self.enable_thinking, **kwargs)

    def prompt_messages(
        self, prompt: str | list[dict[str, Any]], system_prompt: str | None = None
    ) -> list[dict[str, Any]]:
        """A task's prompt as chat messages: a string becomes one user message; the system prompt (`system_prompt`,
        else the format's own) goes first unless the messages already start with a system message."""
        if not isinstance(prompt, (str, list)):
            raise ValueError("a task's prompt must be a string or a list of chat messages, "
                             f"got {type(prompt).__name__}")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        system = system_prompt or self.system_prompt
        if system and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def prompt_ids(self, messages: list[dict[str, Any]], images: list[ToolImage] | None = None) -> list[int]:
        """The prompt's ids: the template's rendering of `messages` with the generation prompt appended (rendered
        once per distinct `messages`, then copied); `images`: those of the messages' image parts, in order."""
        key = json.dumps(messages, sort_keys=True, default=str)
        cache = self._prompt_cache
        ids = cache.get(key)
        if ids is None:
            ids = self.encode(self._render(messages, add_generation_prompt=True))
            ids = cache[key] = self.expand_images(ids, images or [])
            if len(cache) > PROMPT_CACHE_SIZE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return list(ids)

    def expand_images(self, ids: list[int], images: list[ToolImage]) -> list[int]:
        """`ids` with the k-th `<|image_pad|>` repeated as many times as image k takes tokens."""
        if self.vision is None:
            if images:
                raise ValueError("images were given to a text-only policy's chat format")
            return ids
        pad = self.vision.image_token_id
        at = [i for i, t in enumerate(ids) if t == pad]
        if len(at) != len(images):
            raise ValueError(f"the rendering holds {len(at)} image placeholders for {len(images)} images")
        if not at:
            return ids
        out: list[int] = []
        prev = 0
        for i, image in zip(at, images):
            out.extend(ids[prev:i])
            out.extend([pad] * self.vision.num_tokens(image))
            prev = i + 1
        out.extend(ids[prev:])
        return out

    def tool_response_delta(self, tool_messages: list[dict[str, Any]], *, turn_closed: bool = True,
                            images: list[ToolImage] | None = None) -> list[int]:
        """Ids the template places after an assistant turn, through the next generation prompt.

        `tool_messages` are `{"role": "tool", "content": ...}` dicts (content already truncated); an empty list
        gives just the end of the turn and the next generation prompt. With `turn_closed=True` the assistant turn
        already ends with the policy's `<|im_end|>` and the delta starts right after it; with False (the turn was
        cut by `</tool_call>` or the per-turn token limit) the delta starts with the closing `<|im_end|>`.
        `images`: those of the messages' image parts, in order (a VL policy's).
        """
        dummy = [
            {"role": "user", "content": _DUMMY_USER},
            {"role": "assistant", "content": _DUMMY_ASSISTANT},
            *({**m, "content": self._neutral_content(m["content"])} for m in tool_messages),
        ]
        suffix = self._delta_text(dummy, self._delta_tools is not False)
        if self._delta_tools is None and tool_messages:
            # Qwen-style templates render the tool schemas in the system turn only, so the text after the assistant
            # turn is the same without them, and leaving them out is most of the rendering's cost (each tool turn
            # of a rollout renders one). Checked once, on the first real tool turn.
            self._delta_tools = self._delta_text(dummy, False) != suffix
        start = self._im_end_text_len if turn_closed else 0
        # <|im_end|> is a special token, so BPE never merges across it: tokenizing the suffix alone gives the same
        # ids as tokenizing the whole rendering (tests/rollout/test_chat.py checks this).
        return self.expand_images(self.encode(suffix[start:]), images or [])

    def _neutral_content(self, content: Any) -> Any:
        if isinstance(content, str):
            return self.neutralize(content)
        if isinstance(content, list):
            return [{**p, "text": self.neutralize(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str)
                    else p for p in content]
        return content

    def _delta_text(self, dummy: list[dict[str, Any]], with_tools: bool) -> str:
        """The rendering of `dummy` from the `<|im_end|>` that closes its assistant turn on."""
        text = self._render(dummy, add_generation_prompt=True, with_tools=with_tools)
        at = text.rfind(_DUMMY_ASSISTANT)
        close = text.find(IM_END, at) if at >= 0 else -1
        if close < 0:
            raise ValueError("the chat template does not close an assistant turn with <|im_end|>; use a Qwen3 template")
        return text[close:]
