"""Which drawn training tasks gave GRPO nothing to learn from: those whose group's samples all scored alike (all
solved, or all failed). The sampler (data/tasks.py) leaves such a task out of the next `data.skip_settled_epochs` whole
epochs of draws, then draws it again, since the policy has moved by then. An epoch is a pass over the tasks still
drawn, so it shortens as more sit out and they come back sooner; counting draws instead (N x the number of tasks)
let the draws narrow to a handful of tasks that the policy then overfitted (bench/README.md). When the horizon
schedule lets episodes run longer (ScalingInter-RL's next stage), every task set aside comes back at once: a task
that every sample failed in 3 turns may be solved in 6 (the synchronous loop, trainer/loop.py, does that).

GRESO (Zheng et al., 2025, "Act Only When It Pays") measured that a prompt whose samples scored alike in one epoch
very likely scores alike in the next, and skips such prompts with a probability it adapts. This is the deterministic
form, a fixed number of epochs, so that a resumed run draws the tasks it would have drawn.
Left out: the asynchronous loop and verl, which draw tasks by position ahead of the results (recipe/schema.py
refuses the setting there); a graded learnability score (p(1 - p)) beyond alike or not.
"""
from __future__ import annotations

from rlfactory.rollout.trajectory import Trajectory


def settled_draws(draws: list[int], trajectories: list[Trajectory]) -> list[int]:
    """The task indices of `draws` (one per GRPO group, in the batch's order) whose group scored alike. Samples that
    failed on the infrastructure, or whose reward function raised, say nothing about the task and are left out; a
    group with no other sample is not settled (it is drawn again as usual)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_key, []).append(t)
    if len(groups) != len(draws):
        raise ValueError(f"{len(draws)} tasks were drawn but the batch holds {len(groups)} groups")
    out = []
    for index, group in zip(draws, groups.values()):
        rewards = [t.reward for t in group if t.reward is not None and not t.reward_failed and not t.infra_failed]
        if rewards and max(rewards) == min(rewards):
            out.append(index)
    return out
