"""Advantages of a branched group (`rollout.branching`): a baseline per branch point.

A branched group is a tree of depth one: roots play the first turns, then each root's episode is forked into
`width` branches that play on (`Trajectory.branch`). Each leaf has a reward R. Two kinds of tokens get two
advantages:

- a root's shared prefix (its first turns, generated once): the mean reward of its branches against the mean of the
  other roots' branch means (0 with one root). Trained once, in branch 0 (`train_prefix_once` masks the copies);
- a branch's own continuation: its reward against the mean reward of its siblings, which left the same state (0
  without siblings).

Both baselines are made of other, independently sampled subtrees, so neither depends on the actions it scores (the
argument of docs/algorithms.md). With `norm_adv_by_std` both are divided by the standard deviation of the group's
leaf rewards (+1e-6), GRPO's scale. Trajectories without a branch in a group (an infrastructure failure is a group of
its own) get GRPO's leave-one-out difference on all their tokens.

Left out: deeper trees, branching where the policy's entropy is high, turn-level credit inside a branch.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from rlfactory.rollout.trajectory import Trajectory

EPS = 1e-6


def is_branched(trajs: list[Trajectory]) -> bool:
    return any(t.branch is not None for t in trajs)


def train_prefix_once(trajs: list[Trajectory]) -> list[Trajectory]:
    """The trajectories with each root's shared prefix masked out of the loss in every branch but branch 0 (copies of
    those; the others as they are): the prefix's tokens are then trained, and counted in the loss's normaliser,
    once."""
    out = []
    for t in trajs:
        if t.branch is None or t.branch.trains_prefix or t.branch.prefix_tokens == 0:
            out.append(t)
            continue
        n = t.branch.prefix_tokens
        out.append(t.model_copy(update={"loss_mask": [0] * n + t.loss_mask[n:]}))
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def branch_advantages(trajs: list[Trajectory], *, norm_by_std: bool) -> list[tuple[float, float]]:
    """Per trajectory (in order): (its shared prefix's advantage, its own continuation's advantage)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        groups[t.group_key].append(i)
    out: list[tuple[float, float]] = [(0.0, 0.0)] * len(trajs)
    for members in groups.values():
        rewards = {i: float(trajs[i].reward or 0.0) for i in members}
        scale = 1.0
        if norm_by_std and len(members) > 1:
            scale = float(torch.tensor(list(rewards.values()), dtype=torch.float64).std()) + EPS
        roots: dict[int, list[int]] = defaultdict(list)
        for i in members:
            b = trajs[i].branch
            roots[b.root if b is not None else -1 - i].append(i)  # a flat trajectory is a root of its own
        root_mean = {r: sum(rewards[i] for i in leaves) / len(leaves) for r, leaves in roots.items()}
        for r, leaves in roots.items():
            others = _mean([m for q, m in root_mean.items() if q != r])
            prefix = 0.0 if others is None else (root_mean[r] - others) / scale
            for i in leaves:
                siblings = _mean([rewards[j] for j in leaves if j != i])
                own = 0.0 if siblings is None else (rewards[i] - siblings) / scale
                if trajs[i].branch is None:  # flat: one advantage on every token, against the others of the group
                    rest = _mean([rewards[j] for j in members if j != i])
                    own = prefix = 0.0 if rest is None else (rewards[i] - rest) / scale
                out[i] = (prefix, own)
    return out


def token_advantages(trajs: list[Trajectory], per_traj: list[tuple[float, float]], shape: tuple[int, int],
                     response_mask: torch.Tensor) -> torch.Tensor:
    """[N, T]: the prefix advantage on each row's first `branch.prefix_tokens` tokens and its own after them, zero
    off the loss mask (so a masked copy of a prefix carries none)."""
    adv = torch.zeros(shape, dtype=torch.float32)
    for i, (t, (prefix, own)) in enumerate(zip(trajs, per_traj)):
        n = min(t.branch.prefix_tokens if t.branch is not None else 0, shape[1])
        adv[i, :n] = prefix
        adv[i, n:] = own
    return adv * response_mask
