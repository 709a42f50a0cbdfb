"""Horizon schedules: how many assistant turns a trajectory may take at a given training step.

`fixed` is a constant; `scaling_inter` is AgentGym-RL's ScalingInter-RL (https://arxiv.org/abs/2509.08755): short
horizons first so the policy learns to finish, then longer ones so it learns to explore. Both are pure functions of
the global step, so a resumed run lands on the same stage without any saved schedule state.

Left out: adaptive schedules driven by metrics (they would need state and break resume-by-step).
"""
from __future__ import annotations

from rlfactory.recipe.rollout import FixedHorizon, HorizonConfig, ScalingInterHorizon


def stage_for_step(cfg: HorizonConfig, global_step: int) -> int:
    """Index of the schedule stage in force at `global_step` (0-based steps; 0 for `fixed`).

    `scaling_inter` advances one entry every `interval_steps` steps and then stays on the last entry.
    """
    if global_step < 0:
        raise ValueError(f"global_step must be >= 0, got {global_step}")
    if isinstance(cfg, FixedHorizon):
        return 0
    if isinstance(cfg, ScalingInterHorizon):
        return min(global_step // cfg.interval_steps, len(cfg.horizons) - 1)
    raise TypeError(f"unknown horizon config {type(cfg).__name__}")


def horizon_for_step(cfg: HorizonConfig, global_step: int) -> int:
    """Maximum assistant turns per trajectory at `global_step`."""
    stage = stage_for_step(cfg, global_step)
    if isinstance(cfg, FixedHorizon):
        return cfg.turns
    return cfg.horizons[stage]


def max_horizon(cfg: HorizonConfig) -> int:
    """The largest horizon the schedule ever reaches (sizes buffers and context checks up front)."""
    if isinstance(cfg, FixedHorizon):
        return cfg.turns
    return max(cfg.horizons)
