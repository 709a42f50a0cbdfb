"""Which advantages a batch trains on: the one rule, for both loops and the generator's share of an update.

- a flat group: GRPO's (grpo.py), or with `algorithm.turn_credit` one per assistant turn (turn_credit.py);
- a branched group (`rollout.branching`): a baseline per branch point (branch_credit.py) on each root's shared
  prefix, and on each branch's own turns the branch's GRPO-style advantage against its siblings, or, with
  `turn_credit` as well, the per-turn advantages computed over the group's leaves;
- then, whichever of those, negative advantages scaled by `algorithm.negative_advantage_scale`.

Left out: how the advantages enter the loss (grpo.policy_loss).
"""
from __future__ import annotations

import torch

from rlfactory.algorithms import branch_credit, turn_credit
from rlfactory.algorithms.grpo import GRPOBatch, compute_advantages
from rlfactory.recipe.training import AlgorithmConfig
from rlfactory.rollout.trajectory import Trajectory


def advantages(kept: list[Trajectory], batch: GRPOBatch, a: AlgorithmConfig) -> torch.Tensor:
    """[N, T] advantages of `batch` (built from `kept`, in order; copies of shared prefixes already masked), negative
    ones scaled by `algorithm.negative_advantage_scale`."""
    adv = _advantages(kept, batch, a)  # [N, T]
    if a.negative_advantage_scale == 1.0:
        return adv
    return torch.where(adv < 0, adv * a.negative_advantage_scale, adv)


def _advantages(kept: list[Trajectory], batch: GRPOBatch, a: AlgorithmConfig) -> torch.Tensor:
    adv = compute_advantages(batch, norm_adv_by_std=a.norm_adv_by_std)  # [N, T]
    mask = batch.response_mask  # [N, T]
    shape = (int(mask.shape[0]), int(mask.shape[1]))
    turn_level = None
    if a.turn_credit.estimator != "none":
        episode = ((adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).tolist()  # [N]
        per_turn = turn_credit.turn_advantages(kept, a.turn_credit, norm_by_std=a.norm_adv_by_std, episode=episode)
        turn_level = turn_credit.token_advantages(kept, per_turn, shape, mask)  # [N, T]
    if not branch_credit.is_branched(kept):
        return adv if turn_level is None else turn_level
    per_traj = branch_credit.branch_advantages(kept, norm_by_std=a.norm_adv_by_std)
    tree = branch_credit.token_advantages(kept, per_traj, shape, mask)  # [N, T]
    if turn_level is None:
        return tree
    own = torch.zeros(shape, dtype=torch.bool)  # each branch's own tokens: after its shared prefix
    for i, t in enumerate(kept):
        own[i, min(t.branch.prefix_tokens if t.branch is not None else 0, shape[1]):] = True
    return torch.where(own, turn_level, tree)
