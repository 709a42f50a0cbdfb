"""Chunked response logprobs (algorithms/token_logprobs.py) against today's dense computation: the same logprobs,
entropies and gradients of a GRPO loss for every parameter (tied and untied embeddings, temperature, with and without
the entropy gradient, shared prompts on and off, LoRA, autocast), and no vocabulary-sized tensor kept for backward."""
from __future__ import annotations

import math

import pytest
import torch

from rlfactory.algorithms import grpo, token_logprobs
from rlfactory.algorithms.grpo import actor_config, build_batch, policy_loss, response_logprobs, set_global_batch
from rlfactory.algorithms.token_logprobs import chunked_token_logprobs, dense_token_logprobs, split_lm_head
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.recipe.training import AlgorithmConfig, KLConfig
from rlfactory.rollout.trajectory import Trajectory

VOCAB = 151_669  # the offline Qwen3 tokenizer's ids (tests/fixtures_models.py)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_chunks_equal_whole_logits(temperature, entropy_grad, bias):
    g = torch.Generator().manual_seed(0)
    n, t_len, h, v = 3, 7, 16, 50
    hidden = torch.randn(n, t_len, h, generator=g, requires_grad=True)  # [N, T, H]
    head = torch.nn.Linear(h, v, bias=bias)
    labels = torch.randint(0, v, (n, t_len), generator=g)
    w_lp, w_ent = torch.randn(n, t_len, generator=g), torch.randn(n, t_len, generator=g)

    def run(chunked: bool) -> list[torch.Tensor]:
        hidden.grad = None
        head.zero_grad(set_to_none=True)
        kw = {"temperature": temperature, "with_entropy": True, "entropy_grad": entropy_grad}
        if chunked:  # 4 tokens a chunk: 21 tokens in 6 chunks, the last one short
            lp, ent = chunked_token_logprobs(hidden, head, labels, chunk_logits=4 * v, **kw)
        else:
            lp, ent = dense_token_logprobs(head(hidden), labels, **kw)
        (lp * w_lp + ent * w_ent).sum().backward()
        grads = [hidden.grad] + [p.grad for p in head.parameters()]
        return [lp.detach(), ent.detach()] + [x.clone() for x in grads]

    # float32 sums taken in another order differ by a few ulps of the tensor's largest entry, and which ulps depends
    # on the CPU's vector width (CI's machine is not this one): the tolerance scales with that entry
    for dense, chunked in zip(run(False), run(True)):
        torch.testing.assert_close(chunked, dense, rtol=1e-5, atol=1e-5 * max(1.0, float(dense.abs().max())))


def _traj(group: int, k: int, prompt: list[int], resp: list[int], mask: list[int]) -> Trajectory:
    return Trajectory(id=f"{group}/{k}", group_id=f"g{group}", prompt_ids=prompt, response_ids=resp, loss_mask=mask,
                      logprobs=[-3.0 if m else 0.0 for m in mask], reward=float(k % 2))


def _batch() -> grpo.GRPOBatch:
    """Two groups of three rows sharing a prompt (18 and 20 tokens), responses of 5-12 tokens with tool spans."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for group, p_len in enumerate([18, 20]):
        prompt = torch.randint(0, VOCAB, (p_len,), generator=g).tolist()
        for k, r_len in enumerate([12, 5, 9]):
            resp = torch.randint(0, VOCAB, (r_len,), generator=g).tolist()
            mask = [0 if 2 <= i < 4 else 1 for i in range(r_len)]  # a tool span after two policy tokens
            rows.append(_traj(group, k, prompt, resp, mask))
    return build_batch(rows, pad_id=0)


@pytest.fixture(scope="module")
def qwen3_vocab_models():
    """Tiny Qwen3s with the real vocabulary, untied and tied embeddings."""
    return {tied: build_tiny_qwen3(VOCAB, seed=3, tie_word_embeddings=tied) for tied in (False, True)}


def _grpo_step(model, batch, *, dense: bool, chunk_logits: int, temperature: float, entropy_grad: bool,
               share: bool, monkeypatch) -> list[torch.Tensor]:
    """Logprobs, entropies and every parameter's gradient of verl's GRPO loss (clipped policy loss, entropy bonus
    when `entropy_grad`, KL to a fixed reference) through `response_logprobs`, dense or in chunks."""
    monkeypatch.setattr(grpo, "DENSE_MAX_LOGITS", math.inf if dense else 0)
    monkeypatch.setattr(token_logprobs, "CHUNK_LOGITS", chunk_logits)
    alg = AlgorithmConfig(micro_batch_size=8, entropy_coef=0.01 if entropy_grad else 0.0,
                          kl=KLConfig(use_reference=True, coef=0.1))
    cfg = actor_config(alg, samples_per_prompt=3, mini_batch_prompts=2)
    set_global_batch(cfg, batch)
    adv = torch.linspace(-1.0, 1.0, batch.responses.numel()).view_as(batch.response_mask) * batch.response_mask
    model.zero_grad(set_to_none=True)
    model.train()
    try:
        logp, ent = response_logprobs(model, batch, temperature=temperature, with_entropy=True,
                                      entropy_grad=entropy_grad, share_prompts=share)
        loss, _ = policy_loss(cfg, log_prob=logp, old_log_prob=batch.old_log_probs + 0.05 * adv, advantages=adv,
                              response_mask=batch.response_mask, entropy=ent,
                              ref_log_prob=batch.old_log_probs - 0.1)
        loss.backward()
    finally:
        model.eval()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return [logp.detach(), ent.detach(), *grads]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_grpo_gradients_equal_the_dense_computation(qwen3_vocab_models, monkeypatch, tied, share, entropy_grad):
    model, batch = qwen3_vocab_models[tied], _batch()
    kw = {"temperature": 0.7, "entropy_grad": entropy_grad, "share": share, "monkeypatch": monkeypatch}
    dense = _grpo_step(model, batch, dense=True, chunk_logits=token_logprobs.CHUNK_LOGITS, **kw)
    chunked = _grpo_step(model, batch, dense=False, chunk_logits=5 * VOCAB, **kw)  # 5 tokens a chunk
    mask = batch.response_mask.bool()
    torch.testing.assert_close(chunked[0][mask], dense[0][mask], rtol=0, atol=2e-5)
    torch.testing.assert_close(chunked[1][mask], dense[1][mask], rtol=0, atol=2e-5)
    names = [n for n, _ in model.named_parameters()]
    for name, c, d in zip(names, chunked[2:], dense[2:]):
        scale = float(d.abs().max())
        assert scale > 0, name  # every parameter is reached (the head through the embedding too, when tied)
        # float32 sums over 151,669 words in another order: ~5e-5 of the largest entry at worst (measured)
        torch.testing.assert_close(c, d, rtol=1e-4, atol=2e-4 * scale, msg=name)


def test_without_gradient_the_values_are_the_same(qwen3_vocab_models, monkeypatch):
    """The reference and proximal passes (`torch.no_grad`) take the chunked path too."""
    model, batch = qwen3_vocab_models[True], _batch()
    out = {}
    for dense in (True, False):
        monkeypatch.setattr(grpo, "DENSE_MAX_LOGITS", math.inf if dense else 0)
        with torch.no_grad():
            out[dense] = response_logprobs(model, batch, temperature=0.6, with_entropy=True, share_prompts=True)
    torch.testing.assert_close(out[False][0], out[True][0], rtol=0, atol=2e-5)
    torch.testing.assert_close(out[False][1], out[True][1], rtol=0, atol=2e-5)


def test_no_vocabulary_sized_activation_is_kept_for_backward(qwen3_vocab_models, monkeypatch):
    """What autograd keeps between the forward and the backward pass: dense, the [N, T, V] logits; chunked, nothing
    with a vocabulary dimension but the head's weight itself."""
    model, batch = qwen3_vocab_models[False], _batch()
    params = {p.data_ptr() for p in model.parameters()}

    def kept_vocab_sized(dense: bool) -> list[tuple[int, ...]]:
        monkeypatch.setattr(grpo, "DENSE_MAX_LOGITS", math.inf if dense else 0)
        kept: list[tuple[int, ...]] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            if VOCAB in t.shape and t.data_ptr() not in params:
                kept.append(tuple(t.shape))
            return t

        model.train()
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                logp, ent = response_logprobs(model, batch, with_entropy=True, entropy_grad=True)
        finally:
            model.eval()
        assert logp.requires_grad and ent.requires_grad
        return kept

    assert kept_vocab_sized(dense=True)  # the probe sees the logits when they are kept
    assert kept_vocab_sized(dense=False) == []


def test_lora_policy_and_its_base_weights(monkeypatch):
    """Through a PEFT wrapper: the adapters' gradients, and the disabled adapter (the KL reference) in chunks."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_tiny_qwen3(VOCAB, seed=4, tie_word_embeddings=True),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    for p in model.parameters():  # LoRA's B starts at zero: move it so the adapter changes the logits
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    assert split_lm_head(model) is not None
    batch = _batch()
    kw = {"temperature": 1.0, "entropy_grad": True, "share": True, "monkeypatch": monkeypatch}
    dense = _grpo_step(model, batch, dense=True, chunk_logits=token_logprobs.CHUNK_LOGITS, **kw)
    chunked = _grpo_step(model, batch, dense=False, chunk_logits=7 * VOCAB, **kw)
    trained = [i for i, p in enumerate(model.parameters()) if p.requires_grad]
    assert trained
    for i in [0, 1] + [2 + i for i in trained]:
        torch.testing.assert_close(chunked[i], dense[i], rtol=1e-4, atol=2e-4 * float(dense[i].abs().max()))
    base = {}
    for dense_path in (True, False):
        monkeypatch.setattr(grpo, "DENSE_MAX_LOGITS", math.inf if dense_path else 0)
        with torch.no_grad(), model.disable_adapter():
            base[dense_path] = response_logprobs(model, batch)[0]
    torch.testing.assert_close(base[False], base[True], rtol=0, atol=2e-5)
    assert float((base[True] - dense[0]).abs().max()) > 1e-3  # the adapter was really off


def test_autocast_computes_the_head_in_its_dtype(qwen3_vocab_models, monkeypatch):
    """`model.compute_dtype: bfloat16`: the head's matmul in bfloat16 on both paths, the rest in float32."""
    from rlfactory.models.precision import set_compute_dtype

    model, batch = qwen3_vocab_models[False], _batch()
    set_compute_dtype(model, torch.bfloat16)
    try:
        kw = {"temperature": 1.0, "entropy_grad": True, "share": False, "monkeypatch": monkeypatch}
        dense = _grpo_step(model, batch, dense=True, chunk_logits=token_logprobs.CHUNK_LOGITS, **kw)
        chunked = _grpo_step(model, batch, dense=False, chunk_logits=5 * VOCAB, **kw)
    finally:
        set_compute_dtype(model, None)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(chunked[0][mask], dense[0][mask], rtol=0, atol=2e-2)
    for c, d in zip(chunked[2:], dense[2:]):
        torch.testing.assert_close(c, d, rtol=0.05, atol=0.02 * float(d.abs().max()))


def test_heads_that_are_not_one_linear_map_use_the_dense_path():
    from peft import LoraConfig, get_peft_model

    model = build_tiny_qwen3(97, seed=0)
    assert split_lm_head(model) == (model.model, model.lm_head)
    lora_head = get_peft_model(build_tiny_qwen3(97, seed=0),
                               LoraConfig(r=2, target_modules=["lm_head", "q_proj"], task_type="CAUSAL_LM"))
    assert split_lm_head(lora_head) is None
    model.config.model_type = "gemma2"  # soft-capped logits: not a plain head
    assert split_lm_head(model) is None


def test_gradient_checkpointing(monkeypatch):
    """`model.gradient_checkpointing`: the decoder recomputes its layers, the chunks their logits; same gradients."""
    model = build_tiny_qwen3(VOCAB, seed=5)
    model.gradient_checkpointing_enable()
    batch = _batch()
    kw = {"temperature": 0.8, "entropy_grad": False, "share": True, "monkeypatch": monkeypatch}
    dense = _grpo_step(model, batch, dense=True, chunk_logits=token_logprobs.CHUNK_LOGITS, **kw)
    chunked = _grpo_step(model, batch, dense=False, chunk_logits=9 * VOCAB, **kw)
    for c, d in zip(chunked, dense):
        torch.testing.assert_close(c, d, rtol=1e-4, atol=2e-4 * float(d.abs().max()))
