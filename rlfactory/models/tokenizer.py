"""The real Qwen3 tokenizer, built offline, and the project's Qwen3 chat template.

`load_qwen_tokenizer()` rebuilds Qwen's byte-level BPE from the vocabulary qwen-agent ships
(`qwen_agent/utils/qwen.tiktoken`, 151,643 ranks), adds Qwen3's 26 added tokens with their real ids, Qwen's
pre-tokenizer regex and NFC normalizer, and attaches `templates/qwen3.jinja`. The first build takes a few seconds
(merges are derived from the ranks); the result is cached on disk, and later loads read the cache.

Left out on purpose: downloading anything (tests and CPU runs must work offline) and Qwen3's vision/FIM tokens'
semantics (they exist with their ids so ids line up, nothing here uses them).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)

TEMPLATE_PATH = Path(__file__).parent / "templates" / "qwen3.jinja"

# Qwen2/Qwen3's pre-tokenizer split (single digits, unlike cl100k's \p{N}{1,3}).
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's added tokens (tokenizer_config.json `added_tokens_decoder`): (id, content, special).
# "special" ones are dropped by decode(skip_special_tokens=True); tool/think tags are not special in Qwen3.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)
QWEN3_BPE_RANKS = 151_643
QWEN3_MODEL_VOCAB_SIZE = 151_936
"""Embedding rows in real Qwen3 checkpoints (padded past the 151,669 tokenizer ids)."""

# Bump when the build recipe changes so stale caches are not reused.
_CACHE_VERSION = "v1"


def default_cache_dir() -> Path:
    """Where the built tokenizer is kept: $RLFACTORY_CACHE_DIR or ~/.cache/rlfactory."""
    root = os.environ.get("RLFACTORY_CACHE_DIR") or (Path.home() / ".cache" / "rlfactory")
    return Path(root) / f"qwen3-tokenizer-{_CACHE_VERSION}"


def qwen_tiktoken_path() -> Path:
    """The BPE ranks file qwen-agent ships (found without importing qwen-agent, which takes over a second)."""
    spec = importlib.util.find_spec("qwen_agent")
    if spec is None or spec.origin is None:
        raise RLFactoryError(
            "building the offline Qwen tokenizer needs the BPE vocabulary from qwen-agent: pip install qwen-agent")
    path = Path(spec.origin).parent / "utils" / "qwen.tiktoken"
    if not path.exists():
        raise RLFactoryError(f"{path} is missing: reinstall qwen-agent (pip install --force-reinstall qwen-agent)")
    return path


def chat_template_text() -> str:
    """The project's Qwen3 chat template (rlfactory/rollout/templates/qwen3.jinja)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def attach_chat_template(tokenizer: Any) -> Any:
    """Give any HF tokenizer the Qwen3 chat template (e.g. a tiny tokenizer trained for a test). Returns it."""
    tokenizer.chat_template = chat_template_text()
    return tokenizer


def _build_backend() -> Any:
    """Build the `tokenizers.Tokenizer` (BPE + Qwen pre-tokenizer + added tokens) from qwen.tiktoken."""
    converter = TikTokenConverter(vocab_file=str(qwen_tiktoken_path()), pattern=QWEN_PRETOKENIZE_REGEX)
    backend = converter.converted()  # byte-level BPE, Split(regex) + ByteLevel, ByteLevel decoder
    # tiktoken looks a whole pre-token up before merging; ignore_merges does the same (the converter sets it).
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != QWEN3_BPE_RANKS:
        raise RLFactoryError(
            f"{qwen_tiktoken_path()} has {backend.get_vocab_size()} ranks, expected {QWEN3_BPE_RANKS}: "
            "this qwen-agent ships a different vocabulary; pin qwen-agent==0.0.34"
        )
    # Added one at a time, in id order, so each lands on its real id (ids continue after the BPE ranks).
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        token = AddedToken(content, normalized=False, special=special, lstrip=False, rstrip=False,
                           single_word=False)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        got = backend.token_to_id(content)
        if got != token_id:
            raise RLFactoryError(f"building the Qwen tokenizer put {content} at id {got}, expected {token_id}")
    return backend


def _wrap(tokenizer_json: Path) -> Any:
    """A `PreTrainedTokenizerFast` over a saved backend (read straight from the file: `from_pretrained` and
    `tokenizer_object=` both deep-copy the 151k-merge BPE, several times slower)."""
    specials = [c for _, c, special in QWEN3_ADDED_TOKENS if special and c != "<|endoftext|>"]
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials,
        clean_up_tokenization_spaces=False,
        model_max_length=40_960,
        split_special_tokens=False,
    )


_LOADED: dict[Path, Any] = {}


def load_qwen_tokenizer(cache_dir: str | os.PathLike | None = None, *, rebuild: bool = False) -> Any:
    """The Qwen3 tokenizer (a `PreTrainedTokenizerFast`) with the project's Qwen3 chat template, built offline.

    The built tokenizer is saved under `cache_dir` (default: `default_cache_dir()`); `rebuild=True` ignores it.
    Within a process the loaded tokenizer is shared (treat it as read-only). The chat template is always read
    from the project file, so template fixes apply to cached tokenizers too.
    """
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if not rebuild and cache in _LOADED:
        return _LOADED[cache]
    tok = None
    if not rebuild and (cache / "tokenizer.json").exists():
        try:
            tok = _wrap(cache / "tokenizer.json")
        except Exception as e:  # a half-written or incompatible cache is rebuilt, not fatal
            logger.warning("ignoring unreadable tokenizer cache %s (%s); rebuilding", cache, e)
    if tok is None:
        logger.info("building the Qwen3 tokenizer from qwen.tiktoken (one-off, cached in %s)", cache)
        backend = _build_backend()
        if _save_atomically(backend, cache):
            tok = _wrap(cache / "tokenizer.json")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                backend.save(str(Path(tmp) / "tokenizer.json"))
                tok = _wrap(Path(tmp) / "tokenizer.json")
    _LOADED[cache] = attach_chat_template(tok)
    return tok


def _save_atomically(backend: Any, cache: Path) -> bool:
    """Save into a temp dir then rename, so concurrent processes never read a half-written cache."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        backend.save(str(tmp / "tokenizer.json"))
        if cache.exists():  # a stale or broken cache (rebuild): replace it
            shutil.rmtree(cache, ignore_errors=True)
        try:
            tmp.rename(cache)
        except OSError:  # another process won the race: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return True
    except OSError as e:
        logger.warning("could not cache the Qwen tokenizer in %s (%s); it will be rebuilt next time", cache, e)
        return False
