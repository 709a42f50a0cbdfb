"""Which GRPO groups scored alike (all solved, or all failed), judged on the task or on what the update trains, and so
which drawn training tasks gave GRPO nothing to learn from. `rollout/groups_all_same_reward` (trainer/update.py)
counts the groups as trained. The sampler (data/tasks.py) leaves such a task out of the next
`data.skip_settled_epochs` whole epochs of draws, then draws it again, since the policy has moved by then. An epoch
is a pass over the tasks still drawn, so it shortens as more sit out and they come back sooner; counting draws
instead (N x the number of tasks) let the draws narrow to a handful of tasks that the policy then overfitted
(bench/README.md). When the horizon schedule lets episodes run longer (ScalingInter-RL's next stage), every task set
aside comes back at once: a task that every sample failed in 3 turns may be solved in 6 (the synchronous loop,
trainer/loop.py, does that).

GRESO (Zheng et al., 2025, "Act Only When It Pays") measured that a prompt whose samples scored alike in one epoch
very likely scores alike in the next, and skips such prompts with a probability it adapts. This is the deterministic
form, a fixed number of epochs, so that a resumed run draws the tasks it would have drawn.
Left out: the asynchronous loop and verl, which draw tasks by position ahead of the results (recipe/schema.py
refuses the setting there); a graded learnability score (p(1 - p)) beyond alike or not.
"""
from __future__ import annotations

from rlfactory.rollout.trajectory import Trajectory, groups_of


def scored_alike(group: list[Trajectory], *, as_trained: bool = False) -> bool:
    """Whether a group's samples all got the same reward. Samples hit by an infrastructure failure are never
    counted (the update trains none of their tokens). `as_trained=False` judges the task: a sample whose reward
    function raised says nothing about it and is left out too. `as_trained=True` judges the update: such a sample is
    trained with the reward set's failure value, so it counts with that value (`rollout/groups_all_same_reward`: the
    groups whose advantages are all 0). A group with no sample left is not alike."""
    rewards = [t.reward if t.reward is not None else 0.0 for t in group
               if not t.infra_failed and (as_trained or (t.reward is not None and not t.reward_failed))]
    return bool(rewards) and max(rewards) == min(rewards)


def settled_draws(draws: list[int], trajectories: list[Trajectory]) -> list[int]:
    """The task indices of `draws` (one per GRPO group, in the batch's order) whose group scored alike, judged on
    the task (`scored_alike`); a group with no other sample is not settled (it is drawn again as usual)."""
    groups = groups_of(trajectories)
    if len(groups) != len(draws):
        raise ValueError(f"{len(draws)} tasks were drawn but the batch holds {len(groups)} groups")
    return [index for index, group in zip(draws, groups.values()) if scored_alike(group)]
