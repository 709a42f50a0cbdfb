"""Session fixtures: the real offline Qwen3 tokenizer and a tiny random Qwen3 model.

Both are built once per session (the tokenizer from its disk cache after the first run). The model is shared:
tests must not change its weights (copy it, e.g. `build_tiny_qwen3(...)` again, to test weight updates).
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen3's tokenizer (151,669 ids) with the project's Qwen3 chat template."""
    from rlfactory.models.tokenizer import load_qwen_tokenizer

    return load_qwen_tokenizer()


@pytest.fixture(scope="session")
def tiny_qwen3(qwen_tokenizer):
    """A random fp32 Qwen3ForCausalLM: hidden 64, 2 layers, 4 heads / 2 KV heads, seed 0, eval mode, on CPU.

    Its vocabulary is the tokenizer's 151,669 ids (not the 151,936 rows of real checkpoints) so every sampled id
    decodes to text.
    """
    from rlfactory.models.tiny import build_tiny_qwen3

    return build_tiny_qwen3(len(qwen_tokenizer), seed=0)
