"""Off-policy correction and staleness bookkeeping for asynchronous GRPO (`trainer.max_staleness_steps >= 1`).

Three policies meet in an asynchronous step: the behaviour policy mu that sampled each token (its logprob comes from
the engine, `Trajectory.logprobs`; a partial rollout spans several), the proximal policy pi_old (the weights at the
start of this step) and the policy being updated, pi. The PPO ratio pi / pi_old is clipped as usual, and each
token's loss is weighted by the importance weight pi_old / mu (the decoupled objective of AReaL, Fu et al. 2025,
https://arxiv.org/abs/2505.24298), computed by verl's rollout-correction helpers
(`verl.trainer.ppo.rollout_corr_helper`):
- truncated importance sampling (`algorithm.off_policy.is_cap`): weight min(pi_old / mu, cap);
- masking (`algorithm.off_policy.mask_outside: [lo, hi]`): tokens whose ratio falls outside are not trained
  (verl's `token_k1` rejection).
Both use pi_old = pi detached when a step is a single update (one mini-batch, one epoch: the proximal policy is the
current one, so its logprobs come free with the forward pass); otherwise a no-grad pass computes them first.

Staleness of a token trained at step s (policy version s) = s - the version that sampled it.
Left out: sequence-level IS weights, batch-normalised weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from verl.trainer.ppo.rollout_corr_helper import (
    compute_offpolicy_metrics,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)

from rlfactory.recipe.training import OffPolicyConfig


@dataclass
class CorrectionTotals:
    """Token counts and sums over a step's micro-batches, turned into `off_policy/*` metrics by `metrics()`."""

    tokens: float = 0.0
    clipped: float = 0.0
    masked: float = 0.0
    gap_sum: float = 0.0
    kl_sum: float = 0.0
    weight_sum: float = 0.0

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        return {
            "off_policy/tokens": self.tokens,
            "off_policy/tokens_clipped": self.clipped,
            "off_policy/tokens_masked": self.masked,
            "off_policy/logprob_gap": self.gap_sum / n,
            "off_policy/kl": self.kl_sum / n,
            "off_policy/is_weight_mean": self.weight_sum / n,
        }


def correct(cfg: OffPolicyConfig, proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
            totals: CorrectionTotals) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Importance weights ([n, T], or None without `is_cap`) and the response mask with out-of-range tokens removed,
    for one micro-batch; counts go into `totals`. `proximal` is detached; tensors are [n, T]."""
    proximal = proximal.detach()
    mask = mask.to(proximal.dtype)
    if not bool(mask.any()):
        return (torch.zeros_like(mask) if cfg.is_cap is not None else None), mask
    log_ratio = proximal - behaviour
    weights = None
    if cfg.is_cap is not None:
        weights, _ = compute_rollout_correction_weights(log_ratio=log_ratio, response_mask=mask, rollout_is="token",
                                                        rollout_is_threshold=cfg.is_cap)
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        totals.clipped += float(((ratio > cfg.is_cap) & mask.bool()).sum())
        totals.weight_sum += float((weights * mask).sum())
    new_mask = mask
    if cfg.mask_outside is not None:
        lo, hi = cfg.mask_outside
        new_mask, _ = compute_rollout_rejection_mask(log_ratio=log_ratio, response_mask=mask, rollout_rs="token_k1",
                                                     rollout_rs_threshold=f"{lo}_{hi}")
        new_mask = new_mask.to(mask.dtype)
        totals.masked += float((mask - new_mask).clamp(min=0).sum())
    off = compute_offpolicy_metrics(old_log_prob=proximal, rollout_log_prob=behaviour, response_mask=mask.bool())
    n = float(mask.sum())
    totals.tokens += n
    totals.gap_sum += float(((proximal - behaviour).abs() * mask).sum())
    totals.kl_sum += _scalar(off.get("k3_kl", 0.0)) * n
    return weights, new_mask


def _scalar(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def staleness_metrics(trajectories: list[Any], step: int) -> dict[str, float]:
    """`async/staleness_*` of a batch trained at policy version `step`: per policy token and per trajectory (the
    age of its oldest token), mean and max; `async/versions_per_trajectory_max` counts policies within one."""
    token_ages: list[int] = []
    traj_ages: list[int] = []
    spans: list[int] = []
    for t in trajectories:
        versions = [v for v, m in zip(t.policy_versions, t.loss_mask) if m]
        if not versions:
            continue
        token_ages.extend(step - v for v in versions)
        traj_ages.append(step - min(versions))
        spans.append(len(set(versions)))
    if not token_ages:
        return {"async/staleness_token_mean": 0.0, "async/staleness_token_max": 0.0,
                "async/staleness_traj_mean": 0.0, "async/staleness_traj_max": 0.0,
                "async/versions_per_trajectory_max": 0.0}
    return {
        "async/staleness_token_mean": sum(token_ages) / len(token_ages),
        "async/staleness_token_max": float(max(token_ages)),
        "async/staleness_traj_mean": sum(traj_ages) / len(traj_ages),
        "async/staleness_traj_max": float(max(traj_ages)),
        "async/versions_per_trajectory_max": float(max(spans)),
    }


def oldest_version(trajectories: list[Any]) -> int | None:
    """The oldest policy version among the policy tokens of `trajectories` (None when they hold none)."""
    versions = [v for t in trajectories for v, m in zip(t.policy_versions, t.loss_mask) if m]
    return min(versions) if versions else None
