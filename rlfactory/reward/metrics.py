"""Reward metrics over a batch: `combine_reward_metrics` (a batch's metrics from each trajectory's, as verl's workers
score them one at a time) and `pass_at_k`."""
from __future__ import annotations

import statistics

from rlfactory.rollout.trajectory import Trajectory, groups_of


def combine_reward_metrics(per_trajectory: list[dict[str, float]]) -> dict[str, float]:
    """The metrics `RewardSet.score` returns for a batch, from the metrics it returned for each trajectory alone
    (verl's workers score one trajectory at a time): the same keys and the same values."""
    rewards = [m["reward/mean"] for m in per_trajectory]
    out: dict[str, float] = {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/errors": float(sum(m.get("reward/errors", 0.0) for m in per_trajectory)),
    }
    scored: dict[str, list[float]] = {}
    failed: dict[str, float] = {}
    for m in per_trajectory:
        for key, value in m.items():
            if key.startswith("reward/errors/"):
                failed[key] = failed.get(key, 0.0) + value
            elif key not in ("reward/mean", "reward/std", "reward/errors"):
                scored.setdefault(key, []).append(value)
    out.update({key: statistics.fmean(values) for key, values in scored.items()})
    out.update(failed)
    return out


def pass_at_k(trajectories: list[Trajectory], k: int, threshold: float) -> dict[str, float]:
    """pass@1 (mean success rate) and pass@k (a task is solved when any of its k samples is); success means
    reward >= threshold. With exactly k samples per task the unbiased estimator (Chen et al. 2021,
    https://arxiv.org/abs/2107.03374) reduces to `any`. Tasks are the batch's GRPO groups (`groups_of`)."""
    groups = {key: [(t.reward or 0.0) >= threshold for t in group] for key, group in groups_of(trajectories).items()}
    if not groups:
        return {"pass@1": 0.0, f"pass@{k}": 0.0}
    p1 = sum(sum(v) / len(v) for v in groups.values()) / len(groups)
    pk = sum(1.0 for v in groups.values() if any(v)) / len(groups)
    return {"pass@1": p1, f"pass@{k}": pk}
