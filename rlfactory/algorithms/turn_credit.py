"""Advantages per assistant turn (`algorithm.turn_credit`): each turn of a trajectory gets its own advantage, spread
over that turn's policy tokens, instead of one advantage for the whole trajectory.

Two estimators, both built on a turn's return-to-go G_t = r_t + gamma * G_{t+1} (r_t: the weighted step rewards of
turn t, e.g. `env_step_rewards`, and the outcome reward on the last turn; G_t = 0 past the episode's end):

- `returns`: G_t against the mean G_t of the group's *other* trajectories that reached turn index t. The baseline is
  made of other, independent samples only and never counts the turns this trajectory takes later, so it stays
  unbiased when the policy chooses how many turns to take (the per-turn-index normalisation of MT-GRPO does not:
  docs/algorithms.md works through both). A turn index no other trajectory reached keeps the last baseline that had
  company.
- `anchors`: the group's episode-level GRPO advantage plus `anchor_weight` times G_t against the mean return-to-go of
  the other trajectories' turns taken from the same environment state (GiGPO's shape: step groups from states that
  recur across a group). A turn whose state no other trajectory visited adds nothing to the episode advantage.

A turn's state is what the environment reported after the calls that led to it (`state` in a tool result's
structured content, the contract in docs/algorithms.md), else the exact tokens of the observation the policy read
(GiGPO's exact match); every trajectory of a group shares the first turn's state. With `norm_adv_by_std`, the turn
terms are divided by the standard deviation of the group's returns-to-go (one positive number per group, GRPO's
scale); without it they are exactly the differences above.

Left out: how the advantages enter the loss (grpo.py, unchanged), branched groups (their trees change what "the
other trajectories" are and are not built yet).
"""
from __future__ import annotations

import hashlib
from collections import defaultdict

import torch

from rlfactory.recipe.training import TurnCreditConfig
from rlfactory.rollout.trajectory import Trajectory, groups_of

STATE_KEY = "state"
"""Where an environment's tool result reports its state (structured content): a string equal for equal states."""
EPS = 1e-6
"""Added to the group's standard deviation (verl's GRPO epsilon)."""


def turn_rewards(traj: Trajectory) -> list[float]:
    """Reward of each assistant turn: its weighted step rewards, and the rest of the trajectory's reward (the outcome
    rewards) on the last turn. They sum to `traj.reward` (as `reward.token_level_rewards` places them)."""
    n = traj.num_turns
    if n == 0 or traj.reward is None:
        return [0.0] * n
    steps = list((traj.step_rewards or [])[:n])
    steps += [0.0] * (n - len(steps))
    steps[-1] += traj.reward - sum(steps)
    return steps


def returns_to_go(rewards: list[float], gamma: float) -> list[float]:
    out, g = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def turn_states(traj: Trajectory) -> list[str]:
    """The environment state each assistant turn was taken from (see the module docstring). In a trajectory whose
    environment reports states, a turn whose calls reported none (a malformed call, a tool error) changed nothing:
    it keeps the state before it."""
    assistant = [i for i, s in enumerate(traj.turns) if s.role == "assistant"]
    reports = any(isinstance(c.structured, dict) and isinstance(c.structured.get(STATE_KEY), str)
                  for c in traj.tool_calls)
    states = ["start"]
    for k in range(1, len(assistant)):
        reported = [c.structured.get(STATE_KEY) for c in traj.tool_calls
                    if c.turn == k - 1 and isinstance(c.structured, dict)]
        if reported and all(isinstance(s, str) for s in reported):
            states.append("env:" + "|".join(reported))
        elif reports:
            states.append(states[-1])
        else:
            spans = traj.turns[assistant[k - 1] + 1:assistant[k]]
            ids = [i for s in spans if s.role == "tool" for i in traj.response_ids[s.start:s.end]]
            states.append("obs:" + hashlib.sha1(str(ids).encode()).hexdigest()[:16])
    return states


def _leave_out_mean(values: dict[int, list[float]], me: int) -> float | None:
    others = [v for j, vs in values.items() if j != me for v in vs]
    return sum(others) / len(others) if others else None


def return_baseline_advantages(returns: list[list[float]]) -> list[list[float]]:
    """`returns` (one group: per trajectory, each turn's return-to-go) -> G_t minus the mean G_t of the other
    trajectories that reached turn t (the last such mean where none did; 0 before any)."""
    by_index: dict[int, dict[int, list[float]]] = defaultdict(dict)  # turn index -> trajectory -> [G_t]
    for j, gs in enumerate(returns):
        for t, g in enumerate(gs):
            by_index[t][j] = [g]
    out = []
    for i, gs in enumerate(returns):
        advs, base = [], 0.0
        for t, g in enumerate(gs):
            b = _leave_out_mean(by_index[t], i)
            base = base if b is None else b  # no other trajectory got this far: the last baseline with company
            advs.append(g - base)
        out.append(advs)
    return out


def anchor_advantages(returns: list[list[float]], states: list[list[str]]) -> list[list[float]]:
    """`returns` and `states` (one group: per trajectory, per turn) -> G_t minus the mean return-to-go of the other
    trajectories' turns from the same state; 0 where no other trajectory visited it."""
    by_state: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))  # state -> traj -> [G]
    for j, (gs, ss) in enumerate(zip(returns, states)):
        for g, s in zip(gs, ss):
            by_state[s][j].append(g)
    out = []
    for i, (gs, ss) in enumerate(zip(returns, states)):
        advs = []
        for g, s in zip(gs, ss):
            b = _leave_out_mean(by_state[s], i)
            advs.append(0.0 if b is None else g - b)
        out.append(advs)
    return out


def _group_turn_advantages(group: list[Trajectory], cfg: TurnCreditConfig, norm_by_std: bool,
                           episode: list[float]) -> list[list[float]]:
    """Per trajectory of one group, per assistant turn: the advantage (see the module docstring)."""
    returns = [returns_to_go(turn_rewards(t), cfg.gamma) for t in group]
    flat = [g for gs in returns for g in gs]
    scale = 1.0
    if norm_by_std and len(flat) > 1:
        scale = float(torch.tensor(flat, dtype=torch.float64).std()) + EPS
    if cfg.estimator == "returns":
        return [[a / scale for a in advs] for advs in return_baseline_advantages(returns)]
    steps = anchor_advantages(returns, [turn_states(t) for t in group])
    return [[e + cfg.anchor_weight * a / scale for a in advs] for e, advs in zip(episode, steps)]


def turn_advantages(trajs: list[Trajectory], cfg: TurnCreditConfig, *, norm_by_std: bool,
                    episode: list[float]) -> list[list[float]]:
    """Per trajectory (in `trajs`' order), per assistant turn: its advantage. Groups are `group_id`s; `episode`:
    each trajectory's episode-level GRPO advantage (what `anchors` adds its step term to)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        groups[t.group_key].append(i)
    out: list[list[float]] = [[] for _ in trajs]
    for members in groups.values():
        advs = _group_turn_advantages([trajs[i] for i in members], cfg, norm_by_std, [episode[i] for i in members])
        for i, a in zip(members, advs):
            out[i] = a
    return out


def company_fraction(trajs: list[Trajectory], cfg: TurnCreditConfig) -> float:
    """The share of assistant turns whose baseline came from other trajectories of their group (`returns`: another
    one reached the same turn; `anchors`: another one visited the same state): how much the estimator had to work
    with (the `credit/turns_with_company` metric; anchors need states that recur)."""
    turns = with_company = 0
    for group in groups_of(trajs).values():
        keys = [list(range(t.num_turns)) if cfg.estimator == "returns" else turn_states(t) for t in group]
        owners: dict[object, set[int]] = defaultdict(set)
        for j, ks in enumerate(keys):
            for k in ks:
                owners[k].add(j)
        for j, ks in enumerate(keys):
            turns += len(ks)
            with_company += sum(1 for k in ks if owners[k] - {j})
    return with_company / turns if turns else 0.0


def token_advantages(trajs: list[Trajectory], per_turn: list[list[float]], shape: tuple[int, int],
                     response_mask: torch.Tensor) -> torch.Tensor:
    """[N, T]: each assistant turn's advantage on its tokens (row i is `trajs[i]`), zero off the loss mask."""
    adv = torch.zeros(shape, dtype=torch.float32)
    for i, (traj, advs) in enumerate(zip(trajs, per_turn)):
        spans = [s for s in traj.turns if s.role == "assistant"]
        for span, a in zip(spans, advs):
            adv[i, span.start:min(span.end, shape[1])] = a
    return adv * response_mask
