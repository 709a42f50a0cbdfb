"""Per-token logprobs and entropies of response tokens from the policy's final hidden states, a chunk of tokens at a
time, so that the float32 logits over the vocabulary never exist for more than one chunk: `[chunk, V]` instead of
`[N, T, V]`, in the forward pass and in the backward pass.

A plain autograd graph of `lm_head -> / temperature -> log_softmax -> gather` keeps the whole `[N, T, V]` logits
(and the softmax, for an entropy bonus) until the backward pass; for Qwen3's 151,936-row head that is 600 KB per
token. `chunked_token_logprobs` is one `torch.autograd.Function` that keeps only the hidden states `[N*T, H]`, the
head's weight (a parameter, not a copy) and two floats per token (log-normaliser and entropy); its backward pass
recomputes each chunk's logits and writes the chunk's gradients to the hidden states and to the head's weight (with
tied embeddings that weight is the embedding matrix: autograd adds both gradients into the one parameter). The
maths is the one of verl's `logprobs_from_logits` / `entropy_from_logits`, which `dense_token_logprobs` calls on
whole logits (the path for small `N*T*V`, and the reference the tests compare against).

Under autocast (`model.compute_dtype`) the head's matmuls run in the autocast dtype and everything after them in
float32, as `lm_head` under autocast followed by `.float()` does.

Left out: fused or Triton kernels (this is plain torch, CPU and GPU alike); heads that do more than one linear map
(logit soft-capping, scaled logits, LoRA on `lm_head`): `split_lm_head` returns None for them and callers use the
dense logits.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

CHUNK_TOKENS = 256
"""Tokens per chunk: small chunks keep a chunk's logits in the CPU's caches, large ones read the head's weight fewer
times (bench/README.md, "Memory of the update")."""

CHUNK_LOGITS = 1 << 24
"""At most this many logits (tokens x vocabulary) per chunk: 64 MiB of float32, 110 tokens of Qwen3's 151,936-word
vocabulary. The backward pass holds about four `[chunk, V]` float32 buffers at once."""

PLAIN_HEAD_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral"})
"""`config.model_type`s whose causal-LM forward is `lm_head(decoder(...).last_hidden_state)` and nothing more."""
VL_HEAD_MODEL_TYPES = frozenset({"qwen3_vl", "qwen2_5_vl"})
"""Vision-language models of the same shape: the decoder takes the pixels and the mRoPE positions too."""


def split_lm_head(model: Any, *, vision: bool = False) -> tuple[Any, torch.nn.Linear] | None:
    """(decoder, lm_head) of a causal LM whose logits are `lm_head(decoder(...).last_hidden_state)`, looking through
    a PEFT wrapper (its adapters live inside the decoder's layers); None for any other model. `vision`: of a
    vision-language model (whose decoder takes pixel inputs) instead."""
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    types = VL_HEAD_MODEL_TYPES if vision else PLAIN_HEAD_MODEL_TYPES
    if getattr(getattr(base, "config", None), "model_type", None) not in types:
        return None
    head = base.get_output_embeddings()
    decoder = getattr(base, getattr(base, "base_model_prefix", ""), None)
    if type(head) is not torch.nn.Linear or decoder is None:  # a LoRA-wrapped head is not plain
        return None
    return decoder, head


def dense_token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, *, temperature: float, with_entropy: bool, entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `labels` [N, T] (and entropies) from whole logits [N, T, V]: verl's functions, float32."""
    logits = logits.float()  # [N, T, V]
    if temperature > 0:
        logits = logits / temperature
    logp = logprobs_from_logits(logits, labels)  # [N, T]
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach())  # [N, T]
    return logp, entropy


def chunked_token_logprobs(
    hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor, *, temperature: float, with_entropy: bool,
    entropy_grad: bool, chunk_logits: int | None = None, logit_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `labels` [N, T] (and entropies [N, T]) under logits `head(hidden) / temperature`, where `hidden`
    [N, T, H] are the final hidden states at the positions that predict each label. Same values as
    `dense_token_logprobs(head(hidden), ...)` up to float rounding; see the module docstring for the memory.
    `logit_bias` [V] (no gradient) is added to every position's logits: a VL policy's banned image placeholder."""
    n, t_len, h = hidden.shape
    device_type = hidden.device.type
    cdt = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else head.weight.dtype
    chunk = max(1, min(CHUNK_TOKENS, (chunk_logits or CHUNK_LOGITS) // head.out_features))
    bias = head.bias
    if logit_bias is not None:
        bias = logit_bias.detach() if bias is None else bias + logit_bias.detach()
    logp, entropy = _ChunkedLogprobs.apply(
        hidden.reshape(n * t_len, h), head.weight, bias, labels.reshape(n * t_len), float(temperature), cdt,
        chunk, with_entropy, entropy_grad)
    return logp.view(n, t_len), entropy.view(n, t_len) if with_entropy else None


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cdt: torch.dtype,
                  temperature: float) -> torch.Tensor:
    """Float32 logits [c, V] of hidden states [c, H] (weight and bias already in `cdt`), temperature-scaled."""
    z = F.linear(h.to(cdt), weight, bias).float()  # [c, V], a new tensor (no copy when `cdt` is float32)
    return z.div_(temperature) if temperature > 0 else z


class _ChunkedLogprobs(torch.autograd.Function):
    """hidden [M, H], weight [V, H], bias [V] | None, labels [M] -> (logprobs [M], entropies [M], zeros without
    `with_entropy`). Saves the inputs and the per-token log-normaliser and entropy; the backward recomputes logits."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                labels: torch.Tensor, temperature: float, cdt: torch.dtype, chunk: int, with_entropy: bool,
                entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        m = hidden.shape[0]
        logp = torch.empty(m, dtype=torch.float32, device=hidden.device)  # [M]
        lse = torch.empty_like(logp)  # [M] log of the softmax normaliser
        entropy = torch.zeros_like(logp)  # [M]
        with torch.autocast(hidden.device.type, enabled=False), torch.no_grad():
            w, b = weight.to(cdt), None if bias is None else bias.to(cdt)
            for c0 in range(0, m, chunk):
                c1 = min(c0 + chunk, m)
                z = _chunk_logits(hidden[c0:c1], w, b, cdt, temperature)  # [c, V]
                lse[c0:c1] = torch.logsumexp(z, dim=-1)
                logp[c0:c1] = z.gather(1, labels[c0:c1, None]).squeeze(1) - lse[c0:c1]
                if with_entropy:
                    p = (z - lse[c0:c1, None]).exp_()  # [c, V] softmax
                    entropy[c0:c1] = lse[c0:c1] - p.mul_(z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.cdt, ctx.chunk, ctx.entropy_grad = temperature, cdt, chunk, with_entropy and entropy_grad
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple:
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        if not ctx.entropy_grad:
            grad_entropy = None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None  # [M, H]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None  # [V, H]
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None  # [V]
        if grad_logp is None and grad_entropy is None:
            return _cast(grad_h, hidden), _cast(grad_w, weight), _cast(grad_b, bias), None, None, None, None, None, None
        cdt, temperature = ctx.cdt, ctx.temperature
        with torch.autocast(hidden.device.type, enabled=False), torch.no_grad():
            w, b = weight.to(cdt), None if bias is None else bias.to(cdt)
            for c0 in range(0, hidden.shape[0], ctx.chunk):
                c1 = min(c0 + ctx.chunk, hidden.shape[0])
                h = hidden[c0:c1]
                z = _chunk_logits(h, w, b, cdt, temperature)  # [c, V]
                p = (z - lse[c0:c1, None]).exp_()  # [c, V] softmax
                # d logp_y / dz = onehot(y) - p;  d entropy / dz = -p * (z - E_p[z]), E_p[z] = lse - entropy
                if grad_entropy is not None:
                    g = z.sub_((lse[c0:c1] - entropy[c0:c1])[:, None]).mul_(p).mul_(-grad_entropy[c0:c1, None])
                    if grad_logp is not None:
                        g.addcmul_(p, grad_logp[c0:c1, None], value=-1.0)
                else:
                    g = p.mul_(-grad_logp[c0:c1, None])
                if grad_logp is not None:
                    g.scatter_add_(1, labels[c0:c1, None], grad_logp[c0:c1, None])
                if temperature > 0:
                    g.div_(temperature)
                g = g.to(cdt)  # [c, V] gradient of the head's output
                if need_h:
                    grad_h[c0:c1] = g @ w
                if need_w:
                    grad_w.add_(g.t() @ h.to(cdt))  # [V, H], summed over chunks in float32
                if need_b:
                    grad_b.add_(g.sum(0))
        return _cast(grad_h, hidden), _cast(grad_w, weight), _cast(grad_b, bias), None, None, None, None, None, None


def _cast(grad: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    return None if grad is None or like is None else grad.to(like.dtype)
