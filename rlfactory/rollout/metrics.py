"""`rollout_metrics`: the `rollout/*` metrics of a batch of trajectories (turns, finish reasons, errors, tokens, tool
calls, timings, what a branched group's branches shared, and the images a vision-language policy saw). Left out: the
tool servers' own counters (`tools/*`, the ToolManager's) and rewards (`reward/*`, the RewardSet's)."""
from __future__ import annotations

from collections import Counter
from typing import get_args

from rlfactory.rollout.trajectory import FinishReason, Trajectory

FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)


def rollout_metrics(trajs: list[Trajectory], wall_s: float | None = None) -> dict[str, float]:
    """`rollout/*` metrics of a batch: turns, finish reasons, errors, tokens, tool calls, timings."""
    count = len(trajs)
    if count == 0:
        return {"rollout/trajectories": 0}

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    reasons = Counter(t.finish_reason for t in trajs)
    calls = [len(t.tool_calls) for t in trajs]
    m: dict[str, float] = {
        "rollout/trajectories": count,
        "rollout/num_turns_mean": mean([t.num_turns for t in trajs]),
        "rollout/num_turns_max": max(t.num_turns for t in trajs),
        "rollout/response_tokens_mean": mean([len(t.response_ids) for t in trajs]),
        "rollout/response_tokens_max": max(len(t.response_ids) for t in trajs),
        "rollout/policy_tokens_mean": mean([sum(t.loss_mask) for t in trajs]),
        # what the policy sampled: a branch's copy of its root's tokens was sampled once, by the root
        "rollout/generated_tokens": sum(sum(t.loss_mask) - (sum(t.loss_mask[:t.branch.prefix_tokens])
                                                            if t.branch is not None and t.branch.child > 0 else 0)
                                        for t in trajs),
        "rollout/prompt_tokens_mean": mean([len(t.prompt_ids) for t in trajs]),
        "rollout/tool_calls_mean": mean(calls),
        "rollout/tool_calls": sum(calls),
        "rollout/tool_call_errors": sum(c.is_error for t in trajs for c in t.tool_calls),
        "rollout/errors": reasons.get("error", 0),
        "rollout/infra_failed": sum(t.infra_failed for t in trajs),
        "rollout/generate_s_mean": mean([t.timings.get("generate_s", 0.0) for t in trajs]),
        "rollout/tools_s_mean": mean([t.timings.get("tools_s", 0.0) for t in trajs]),
    }
    for reason in FINISH_REASONS:
        m[f"rollout/finish_{reason}"] = reasons.get(reason, 0)
    branches = [t for t in trajs if t.branch is not None and t.branch.child > 0]
    if branches:  # a branched group: what its branches shared with their roots, and how many went on
        m["rollout/branches"] = len(branches)
        m["rollout/branches_went_on"] = sum(t.num_turns > t.branch.prefix_turns for t in branches)
        m["rollout/branch_shared_tokens"] = sum(t.branch.prefix_tokens for t in branches)
    if any(t.images for t in trajs):  # a vision-language policy: what it saw, and what its images cost in tokens
        m["rollout/images_mean"] = mean([len(t.images) for t in trajs])
        m["rollout/image_tokens_mean"] = mean([sum(im.tokens for im in t.images) for t in trajs])
    if wall_s is not None:
        m["rollout/wall_s"] = wall_s
        m["perf/rollout_tokens_per_s"] = sum(len(t.response_ids) for t in trajs) / wall_s if wall_s > 0 else 0.0
    return m
