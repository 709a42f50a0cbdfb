"""GRPO glue over verl's `core_algos`: Trajectories -> padded tensors -> advantages -> policy loss (+ KL, entropy).

GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300 (group-relative advantages, PPO-clip loss).
The maths is verl's (`compute_grpo_outcome_advantage`, `get_policy_loss_fn`, `agg_loss`, `kl_penalty`), called with
the same arguments verl's own actor uses, so both engines optimise the same objective. What is here is only the
tensor plumbing: left-padded prompts + right-padded responses (`[N, P + T]`), the loss mask (1 on policy tokens,
0 on tool/env tokens), old logprobs from the generation pass, and the global-batch normalisation that makes
gradient accumulation over micro-batches equal to one big batch.

Left out: the optimizer step and micro-batch loop (`trainer/loop.py`), off-policy correction (`off_policy.py`),
critics/GAE, sequence packing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage, get_policy_loss_fn, kl_penalty
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig

from rlfactory.algorithms.pixels import PixelRows
from rlfactory.algorithms.token_logprobs import chunked_token_logprobs, dense_token_logprobs, split_lm_head
from rlfactory.models.precision import autocast
from rlfactory.models.vision import VisionProcessor
from rlfactory.recipe.training import AlgorithmConfig
from rlfactory.reward import token_level_rewards
from rlfactory.rollout.trajectory import Trajectory


@dataclass
class GRPOBatch:
    """One step's trajectories as padded tensors. N = B*G trajectories, P = longest prompt, T = longest response."""
    input_ids: torch.Tensor  # [N, P+T] prompt left-padded, response right-padded
    attention_mask: torch.Tensor  # [N, P+T] 1 on real tokens
    position_ids: torch.Tensor  # [N, P+T] positions counted over real tokens only (left padding safe)
    responses: torch.Tensor  # [N, T]
    response_mask: torch.Tensor  # [N, T] float: 1 = policy token (trained), 0 = tool/env token or padding
    old_log_probs: torch.Tensor  # [N, T] behaviour-policy logprobs from the generation pass
    token_level_rewards: torch.Tensor  # [N, T] reward on the last token of each turn / the last policy token
    index: np.ndarray  # [N] group ids (object): trajectories of one prompt share an id
    prompt_len: int  # P
    pixels: PixelRows | None = None  # a VL policy's images and mRoPE positions (algorithms/pixels.py)

    def __len__(self) -> int:
        return int(self.responses.shape[0])

    def select(self, rows: list[int] | torch.Tensor) -> "GRPOBatch":
        """A sub-batch (micro-batch) keeping the same P and T."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return GRPOBatch(
            input_ids=self.input_ids[idx], attention_mask=self.attention_mask[idx],
            position_ids=self.position_ids[idx], responses=self.responses[idx],
            response_mask=self.response_mask[idx], old_log_probs=self.old_log_probs[idx],
            token_level_rewards=self.token_level_rewards[idx], index=self.index[idx.numpy()],
            prompt_len=self.prompt_len, pixels=None if self.pixels is None else self.pixels.select(idx),
        )

    def compact(self) -> "GRPOBatch":
        """Drop padding columns no row of this (sub-)batch uses: a micro-batch of short trajectories then costs
        what its own lengths cost, not the longest trajectory of the step. Response columns are cut only on the
        right, so column k still is response token k (slice per-token tensors such as advantages to
        `responses.shape[1]`)."""
        p = self.prompt_len
        real_p = int(self.attention_mask[:, :p].sum(-1).max())
        real_t = max(1, int(self.attention_mask[:, p:].sum(-1).max()))
        cols = slice(p - real_p, p + real_t)
        return GRPOBatch(
            input_ids=self.input_ids[:, cols], attention_mask=self.attention_mask[:, cols],
            position_ids=self.position_ids[:, cols], responses=self.responses[:, :real_t],
            response_mask=self.response_mask[:, :real_t], old_log_probs=self.old_log_probs[:, :real_t],
            token_level_rewards=self.token_level_rewards[:, :real_t], index=self.index, prompt_len=real_p,
            pixels=None if self.pixels is None else self.pixels.columns(cols),
        )

    def to(self, device: torch.device | str) -> "GRPOBatch":
        return GRPOBatch(
            input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device), responses=self.responses.to(device),
            response_mask=self.response_mask.to(device), old_log_probs=self.old_log_probs.to(device),
            token_level_rewards=self.token_level_rewards.to(device), index=self.index, prompt_len=self.prompt_len,
            pixels=None if self.pixels is None else self.pixels.to(device),
        )


def build_batch(trajectories: list[Trajectory], pad_id: int, vision: VisionProcessor | None = None) -> GRPOBatch:
    """Pad trajectories into a GRPOBatch. Rewards must already be scored (`RewardSet.score`). `vision`: a VL
    policy's image processor, needed when trajectories hold images."""
    n = len(trajectories)
    if n == 0:
        raise ValueError("build_batch: no trajectories")
    p = max(len(t.prompt_ids) for t in trajectories)
    t_len = max(1, max(len(t.response_ids) for t in trajectories))
    input_ids = torch.full((n, p + t_len), pad_id, dtype=torch.long)  # [N, P+T]
    attn = torch.zeros((n, p + t_len), dtype=torch.long)  # [N, P+T]
    mask = torch.zeros((n, t_len), dtype=torch.float32)  # [N, T]
    old = torch.zeros((n, t_len), dtype=torch.float32)  # [N, T]
    rewards = torch.zeros((n, t_len), dtype=torch.float32)  # [N, T]
    index = np.empty(n, dtype=object)
    for i, traj in enumerate(trajectories):
        pl, rl = len(traj.prompt_ids), len(traj.response_ids)
        input_ids[i, p - pl:p] = torch.tensor(traj.prompt_ids, dtype=torch.long)
        attn[i, p - pl:p] = 1
        if rl:
            input_ids[i, p:p + rl] = torch.tensor(traj.response_ids, dtype=torch.long)
            attn[i, p:p + rl] = 1
            mask[i, :rl] = torch.tensor(traj.loss_mask[:rl], dtype=torch.float32)
            lp = traj.logprobs[:rl] + [0.0] * (rl - len(traj.logprobs))
            old[i, :rl] = torch.tensor(lp, dtype=torch.float32)
            rewards[i, :rl] = torch.tensor(token_level_rewards(traj), dtype=torch.float32)
        index[i] = traj.group_key
    old = old * mask  # logprobs of tool tokens are meaningless: keep them out of ratios and KL
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)  # [N, P+T]
    return GRPOBatch(input_ids, attn, position_ids, input_ids[:, p:].clone(), mask, old, rewards, index, p,
                     PixelRows.build(trajectories, position_ids, p, vision))


def exclude_infra_failures(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Trajectories hit by an infrastructure failure (`Trajectory.infra_failed`: a tool server lost or down under a
    call, a rollout that raised) say nothing about the policy: each becomes a group of its own with no trained
    token, so it adds no gradient and the other samples' advantages are those of the samples that really ran."""
    return [t.model_copy(update={"loss_mask": [0] * len(t.loss_mask), "group_id": f"{t.group_id}#infra{i}"})
            if t.infra_failed else t for i, t in enumerate(trajectories)]


def trained_on_infra_failures(hit: list[bool], batch: GRPOBatch) -> int:
    """How many trajectories hit by an infrastructure failure (`hit`, in `batch`'s order) still have a trained token
    in `batch`: 0 when they went through `exclude_infra_failures` (the `rollout/trained_on_infra_failures` metric)."""
    return sum(1 for i, h in enumerate(hit) if h and float(batch.response_mask[i].sum()) > 0)


def compute_advantages(batch: GRPOBatch, *, norm_adv_by_std: bool = True) -> torch.Tensor:
    """Group-relative advantages, verl's `compute_grpo_outcome_advantage`: (R - mean_g) / (std_g + eps) per group,
    broadcast over the response and zeroed off the loss mask. Returns [N, T]."""
    adv, _returns = compute_grpo_outcome_advantage(
        token_level_rewards=batch.token_level_rewards,  # [N, T]
        response_mask=batch.response_mask,  # [N, T]
        index=batch.index,  # [N]
        norm_adv_by_std_in_grpo=norm_adv_by_std,
    )
    return adv  # [N, T]


SHARE_MIN_TOKENS = 64
"""`response_logprobs(share_prompts=True)` splits the pass in two only when that skips at least this many prompt
tokens (a second forward call costs more than a few tokens)."""

DENSE_MAX_LOGITS = 1 << 24
"""`response_logprobs` makes the whole [N, T, V] logits (one LM-head matmul, autograd's log-softmax) when N*T*V is
at most this (64 MiB of float32 a copy), and otherwise works a chunk of tokens at a time (algorithms/token_logprobs.py).
Below it little memory is at stake and chunks are no faster: they recompute the head's matmul in the backward pass,
which wide heads pay for. Benchmarks and tests set it to infinity for the dense path everywhere, or 0 for the chunked
one (bench/README.md, "Memory of the update")."""


def response_logprobs(
    model: Any, batch: GRPOBatch, *, temperature: float = 1.0, with_entropy: bool = False,
    entropy_grad: bool = False, share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of the response tokens under `model` (and per-token entropy), temperature-scaled like the sampler
    (rlfactory/rollout/hf_sampling.py). Returns ([N, T], [N, T] or None). The entropy carries gradient only with
    `entropy_grad` (an entropy bonus); as a metric it is computed on detached logits to save memory.

    Above `DENSE_MAX_LOGITS` logits the LM head runs on the final hidden states a chunk of tokens at a time, in the
    backward pass too (`token_logprobs.chunked_token_logprobs`): the peak holds one chunk's logits, not [N, T, V].

    `share_prompts`: rows with the same prompt (a GRPO group's samples) run the prompt through the model once; its
    keys/values are then shared by every row's response pass (`_shared_prompt_states`). The result is the same
    function of the weights, gradients included, up to float summation order."""
    t_len = batch.responses.shape[1]
    if batch.pixels is not None:
        return _pixel_logprobs(model, batch, temperature=temperature, with_entropy=with_entropy,
                               entropy_grad=entropy_grad, share_prompts=share_prompts)
    split = split_lm_head(model)
    if split is not None and len(batch) * t_len * split[1].out_features <= DENSE_MAX_LOGITS:
        split = None
    with autocast(model):  # model.compute_dtype (models/precision.py); nothing by default
        if split is not None:
            decoder, head = split
            hidden = _shared_prompt_states(model, batch, decoder) if share_prompts else None
            if hidden is None:
                out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=batch.position_ids, use_cache=False)
                hidden = out.last_hidden_state[:, -(t_len + 1):-1, :]  # [N, T, H]: position k predicts token k+1
            return chunked_token_logprobs(hidden, head, batch.responses, temperature=temperature,
                                          with_entropy=with_entropy, entropy_grad=entropy_grad)
        logits = _shared_prompt_states(model, batch) if share_prompts else None
        if logits is None:
            # Only the last T+1 positions' logits are needed (position k predicts token k+1): skipping the LM head
            # over the prompt saves memory that grows with prompt length x vocabulary (151k rows for Qwen3).
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids, use_cache=False, logits_to_keep=t_len + 1)
            logits = out.logits[:, -(t_len + 1):-1, :]  # [N, T, V]
    return dense_token_logprobs(logits, batch.responses, temperature=temperature, with_entropy=with_entropy,
                                entropy_grad=entropy_grad)


def _pixel_logprobs(model: Any, batch: GRPOBatch, *, temperature: float, with_entropy: bool,
                    entropy_grad: bool, share_prompts: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`response_logprobs` of a batch with images, with its pixels and mRoPE positions, the image placeholder out of
    the distribution as the engine samples (algorithms/pixels.py). With `share_prompts`, when no prompt holds an
    image (pictures that tools returned: all in the responses), a group's prompt runs once as for text; otherwise
    every row runs whole. Above `DENSE_MAX_LOGITS` logits the LM head runs a chunk at a time, as for text."""
    t_len = batch.responses.shape[1]
    vl = batch.pixels.model_inputs(batch.position_ids)
    split = split_lm_head(model, vision=True)
    if split is not None and len(batch) * t_len * split[1].out_features <= DENSE_MAX_LOGITS:
        split = None
    decoder = split[0] if split is not None else None
    with autocast(model):
        states = None
        prompts = batch.input_ids[:, :batch.prompt_len]
        if share_prompts and not bool((prompts == batch.pixels.vision.image_token_id).any()):
            states = _shared_prompt_states(model, batch, decoder, vl=vl)
        if states is None:
            if decoder is not None:
                out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **vl)
                states = out.last_hidden_state[:, -(t_len + 1):-1, :]  # [N, T, H]
            else:
                out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                            logits_to_keep=t_len + 1, **vl)
                states = out.logits[:, -(t_len + 1):-1, :]  # [N, T, V]
        if split is not None:
            head = split[1]
            return chunked_token_logprobs(states, head, batch.responses, temperature=temperature,
                                          with_entropy=with_entropy, entropy_grad=entropy_grad,
                                          logit_bias=batch.pixels.placeholder_bias(head.out_features, states.device))
        logits = batch.pixels.ban_placeholder(states)
    return dense_token_logprobs(logits, batch.responses, temperature=temperature, with_entropy=with_entropy,
                                entropy_grad=entropy_grad)


def prompt_groups(batch: GRPOBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct prompts of `batch`: (first row holding each [G], row -> its prompt's index [N])."""
    prompts = batch.input_ids[:, :batch.prompt_len]  # left-padded: equal prompts are equal rows
    n = len(batch)
    if batch.prompt_len == 0:  # no row has a prompt (episodes that never opened): one empty prompt for all
        inverse = torch.zeros(n, dtype=torch.long, device=prompts.device)  # (torch.unique refuses a 0-wide dim)
    else:
        _, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=inverse.device), reduce="amin")
    order = torch.argsort(first)  # prompts in the order of their first row
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[inverse]


def _shared_prompt_states(model: Any, batch: GRPOBatch, decoder: Any = None,
                          vl: dict[str, Any] | None = None) -> torch.Tensor | None:
    """Response-position logits [N, T, V] (or, given the model's `decoder` from `split_lm_head`, its final hidden
    states [N, T, H]) from one pass over the distinct prompts ([G, P], keeping its KV cache) and one over all
    responses ([N, T-1], attending to the prompt keys/values gathered per row). Gathering is an index_select, so the
    backward pass sums each prompt's gradient over the rows that share it. None when sharing would skip too little,
    or the model cannot return a cache while training (gradient checkpointing). `vl`: a VL batch's model inputs
    (`PixelRows.model_inputs`) whose images all lie in the responses: positions [4, N, L] for both passes, the
    pixels for the responses' pass."""
    p, t_len, n = batch.prompt_len, batch.responses.shape[1], len(batch)
    if getattr(model, "is_gradient_checkpointing", False) and model.training:
        return None
    first, inverse = prompt_groups(batch)
    if (n - len(first)) * p < SHARE_MIN_TOKENS:
        return None
    run = model if decoder is None else decoder
    keep = {"logits_to_keep": 1} if decoder is None else {}

    def states(out: Any) -> torch.Tensor:
        return out.logits if decoder is None else out.last_hidden_state

    vl = dict(vl or {})
    positions = vl.pop("position_ids", batch.position_ids)  # [N, L], or a VL batch's [4, N, L]
    out = run(input_ids=batch.input_ids[first, :p], attention_mask=batch.attention_mask[first, :p],
              position_ids=positions[..., first, :p], use_cache=True, **keep)
    head = states(out)[:, -1:, :].index_select(0, inverse)  # [N, 1, V or H]: predicts response token 0
    if t_len == 1:
        return head
    cache = DynamicCache(config=getattr(model, "config", None))
    for i, layer in enumerate(out.past_key_values.layers):
        cache.update(layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse), i)
    rest = run(input_ids=batch.input_ids[:, p:p + t_len - 1], attention_mask=batch.attention_mask[:, :p + t_len - 1],
               position_ids=positions[..., p:p + t_len - 1], past_key_values=cache, use_cache=True, **vl)
    return torch.cat([head, states(rest)], dim=1)  # [N, T, V or H]


def actor_config(algorithm: AlgorithmConfig, *, samples_per_prompt: int, mini_batch_prompts: int) -> Any:
    """verl's ActorConfig carrying our algorithm settings (the policy-loss functions read their knobs from it)."""
    return ActorConfig(
        strategy="fsdp", rollout_n=samples_per_prompt, ppo_mini_batch_size=mini_batch_prompts,
        ppo_micro_batch_size_per_gpu=algorithm.micro_batch_size, clip_ratio=algorithm.clip_ratio_low,
        clip_ratio_low=algorithm.clip_ratio_low, clip_ratio_high=algorithm.clip_ratio_high,
        clip_ratio_c=algorithm.clip_ratio_c, loss_agg_mode=algorithm.loss_agg_mode,
        entropy_coeff=algorithm.entropy_coef, use_kl_loss=algorithm.kl.use_reference and algorithm.kl.coef > 0,
        kl_loss_coef=algorithm.kl.coef, kl_loss_type=algorithm.kl.type, use_torch_compile=False,
        policy_loss=PolicyLossConfig(loss_mode=algorithm.policy_loss),
    )


def set_global_batch(cfg: Any, mini_batch: GRPOBatch) -> None:
    """Normalise micro-batch losses by the whole mini-batch (tokens and sequences), as verl's actor does, so that
    summing micro-batch gradients equals the gradient of the mini-batch loss."""
    cfg.global_batch_info["dp_size"] = 1
    cfg.global_batch_info["batch_num_tokens"] = float(mini_batch.response_mask.sum().clamp(min=1.0))
    cfg.global_batch_info["global_batch_size"] = float((mini_batch.response_mask.sum(-1) > 0).sum().clamp(min=1))
    cfg.global_batch_info["loss_scale_factor"] = cfg.loss_scale_factor


def policy_loss(
    cfg: Any,
    *,
    log_prob: torch.Tensor,  # [n, T] current policy, with grad
    old_log_prob: torch.Tensor,  # [n, T]
    advantages: torch.Tensor,  # [n, T]
    response_mask: torch.Tensor,  # [n, T]
    entropy: torch.Tensor | None = None,  # [n, T]
    ref_log_prob: torch.Tensor | None = None,  # [n, T]
    rollout_is_weights: torch.Tensor | None = None,  # [n, T] off-policy importance weights (off_policy.py)
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to backpropagate for one micro-batch: verl's policy loss - entropy_coef * entropy + kl_coef * KL.
    Mirrors `verl.workers.utils.losses.ppo_loss`. Returns (scalar loss, metrics)."""
    mask = response_mask.to(torch.bool)
    loss_fn = get_policy_loss_fn(cfg.policy_loss.get("loss_mode", "vanilla"))
    pg_loss, pg_metrics = loss_fn(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode, config=cfg, rollout_is_weights=rollout_is_weights,
    )
    metrics = {"loss/pg": float(pg_loss.detach())}
    metrics.update({f"loss/{k.split('/')[-1]}": float(v) for k, v in pg_metrics.items()})
    loss = pg_loss
    if entropy is not None:
        ent = agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=cfg.loss_agg_mode, **cfg.global_batch_info)
        metrics["loss/entropy"] = float(ent.detach())
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * ent
    if cfg.use_kl_loss and ref_log_prob is not None:
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=cfg.kl_loss_type)  # [n, T]
        kl = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=cfg.loss_agg_mode, **cfg.global_batch_info)
        metrics["loss/kl"] = float(kl.detach())
        loss = loss + cfg.kl_loss_coef * kl
    metrics["loss/total"] = float(loss.detach())
    return loss, metrics
