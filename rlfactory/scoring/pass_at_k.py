"""pass@k of scored trajectories: the share of tasks solved by any of their k samples (and pass@1, the mean success
rate), where a sample succeeds when its reward reaches a threshold."""
from __future__ import annotations

from typing import Any


def pass_at_k(trajectories: list[Any], k: int, threshold: float) -> dict[str, float]:
    """pass@1 (mean success rate) and pass@k (a task is solved when any of its k samples is); success means
    reward >= threshold. With exactly k samples per task the unbiased estimator (Chen et al. 2021,
    https://arxiv.org/abs/2107.03374) reduces to `any`."""
    groups: dict[Any, list[bool]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id or t.task_id, []).append((t.reward or 0.0) >= threshold)
    if not groups:
        return {"pass@1": 0.0, f"pass@{k}": 0.0}
    p1 = sum(sum(v) / len(v) for v in groups.values()) / len(groups)
    pk = sum(1.0 for v in groups.values() if any(v)) / len(groups)
    return {"pass@1": p1, f"pass@{k}": pk}
