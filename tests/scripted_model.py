"""A tiny Qwen3 whose weights are set by hand so that sampling from it follows scripts: a token-level Markov chain
inside a real `Qwen3ForCausalLM`, for tests, benchmarks and demos that need a policy which calls tools.

A random tiny model emits uniform junk over 151k ids and practically never a well-formed `<tool_call>`. This one
runs the full transformer forward (attention, MLP, norms, KV cache, batching) with its residual branches zeroed, so
the logits depend on the last token only: each script token has its own embedding direction, and the untied LM head
maps it to the next tokens of the scripts that contain it (branching where scripts share a token). Every step also
emits uniform junk with probability `junk_prob`; from junk the chain re-enters through `junk_exits` (e.g. back to
`<tool_call>` or to `<|im_end|>`). Sampling thus yields well-formed calls, calls mixed across scripts (wrong
arguments), partial tags, junk and plain answers, in proportions the weights set.

Left out: anything a policy learns; training this model is possible but meaningless.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence


def build_scripted_qwen3(
    tokenizer: Any,
    scripts: Sequence[tuple[str, float]],
    *,
    start_token_ids: Sequence[int],
    junk_prob: float = 0.01,
    junk_exits: Mapping[str, float] | None = None,
    hidden_size: int = 64,
    seed: int = 0,
) -> Any:
    """A `Qwen3ForCausalLM` (fp32, eval) over the tokenizer's whole vocabulary that follows `scripts`.

    `scripts`: (text, weight) pairs; after any of `start_token_ids` (the last token of the generation prompt, e.g.
    "\\n\\n" after Qwen3's empty think block) the model starts script i with probability proportional to its weight,
    and where scripts share a token it continues each in proportion to the weights.
    `junk_prob`: probability of a uniform random token at each script step. `junk_exits`: token text -> probability
    of leaving junk through it (default: 5% `<|im_end|>`, 3% `<tool_call>`).
    """
    import torch  # noqa: PLC0415

    from rlfactory.models.tiny import build_tiny_qwen3  # noqa: PLC0415

    if not 0.0 < junk_prob < 1.0:
        raise ValueError(f"junk_prob must be in (0, 1), got {junk_prob}")
    exits = dict(junk_exits if junk_exits is not None else {"<|im_end|>": 0.05, "<tool_call>": 0.03})
    vocab = len(tokenizer)
    counts: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for text, weight in scripts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            continue
        for start in start_token_ids:
            counts[start][ids[0]] += weight
        for a, b in zip(ids, ids[1:]):
            counts[a][b] += weight  # shared tokens branch in proportion to the scripts' weights
    states = sorted(set(counts) | {b for succ in counts.values() for b in succ})
    if len(states) > hidden_size - 1:
        raise ValueError(f"{len(states)} distinct script tokens need hidden_size > {len(states)}")

    model = build_tiny_qwen3(vocab, seed=seed, hidden_size=hidden_size, num_layers=1, heads=4, kv_heads=2,
                             tie_word_embeddings=False)
    d = hidden_size
    scale = math.sqrt(d)  # RMSNorm of a one-hot vector puts sqrt(d) on its coordinate
    junk_dim = d - 1
    with torch.no_grad():
        for layer in model.model.layers:  # residual branches off: the final hidden state is the token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight  # [V, d]
        emb.zero_()
        emb[:, junk_dim] = 1.0
        head = model.lm_head.weight  # [V, d]
        head.zero_()
        for i, tok in enumerate(states):
            emb[tok].zero_()
            emb[tok, i] = 1.0
            succ = counts.get(tok)
            if not succ:
                continue  # e.g. <|im_end|>: a stop token, what follows never matters
            total = sum(succ.values())
            others = vocab - len(succ)
            for nxt, w in succ.items():
                # P(nxt) = (1 - junk) * w/total, the junk mass spread over the `others` tokens at logit 0
                head[nxt, i] = math.log((1 - junk_prob) * (w / total) / junk_prob * others) / scale
        others = vocab - len(exits)
        stay = 1.0 - sum(exits.values())
        for text, p in exits.items():
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"junk exit {text!r} is not a single token")
            head[ids[0], junk_dim] = math.log(p / stay * others) / scale
    return model.eval()


def build_scripted_qwen3_vl(tokenizer: Any, scripts: Sequence[tuple[str, float]], **kwargs: Any) -> Any:
    """`build_scripted_qwen3`'s chain inside a real tiny `Qwen3VLForConditionalGeneration`: its text stack takes the
    scripted weights (the residual branches stay zeroed, so the logits still depend on the last token only, and the
    last token of a prompt is never an image's), under a random vision tower that really runs on every image."""
    import torch  # noqa: PLC0415

    from rlfactory.models.tiny import build_tiny_qwen3_vl  # noqa: PLC0415

    hidden = kwargs.get("hidden_size", 64)
    text = build_scripted_qwen3(tokenizer, scripts, **kwargs)
    model = build_tiny_qwen3_vl(len(tokenizer), seed=kwargs.get("seed", 0), hidden_size=hidden, num_layers=1,
                                heads=4, kv_heads=2)
    state = {("lm_head.weight" if k == "lm_head.weight" else k.replace("model.", "model.language_model.", 1)): v
             for k, v in text.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("model.visual.") for k in missing):
        raise RuntimeError(f"scripted VL weights do not fit: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            assert float(layer.self_attn.o_proj.weight.abs().sum()) == 0.0
    return model.eval()
