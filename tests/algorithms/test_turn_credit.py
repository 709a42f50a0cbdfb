"""Turn-level advantages (algorithms/turn_credit.py): values on hand-made turn sequences and anchor states, their
place on the tokens, the update that trains on them, verl's refusal, and the bias test on a small MDP whose true
policy gradient is known (docs/algorithms.md): the per-turn-index normalisation is biased when the policy decides
how many turns to take, the return baseline is not."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch

from rlfactory.algorithms.turn_credit import (
    anchor_advantages,
    return_baseline_advantages,
    returns_to_go,
    token_advantages,
    turn_advantages,
    turn_rewards,
    turn_states,
)
from rlfactory.preflight import validate_recipe
from rlfactory.recipe.training import TurnCreditConfig
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan


def _traj(tid: str, turns: int, reward: float, *, steps: list[float] | None = None, states: list[str] | None = None,
          obs: list[int] | None = None, group: str = "g") -> Trajectory:
    """`turns` assistant turns of 2 tokens, each but the last followed by a tool turn of 1 token (`obs[k]`, the
    observation's token) whose call reports `states[k]` (when given)."""
    ids, mask, spans, calls = [], [], [], []
    for k in range(turns):
        spans.append(TurnSpan(role="assistant", start=len(ids), end=len(ids) + 2))
        ids += [10 + k, 20 + k]
        mask += [1, 1]
        if k < turns - 1:
            spans.append(TurnSpan(role="tool", start=len(ids), end=len(ids) + 1))
            ids.append(obs[k] if obs else 99)
            mask.append(0)
            structured = {"state": states[k]} if states else {}
            calls.append(ToolCallRecord(turn=k, name="step", structured=structured))
    return Trajectory(id=tid, group_id=group, prompt_ids=[1, 2], response_ids=ids, loss_mask=mask,
                      logprobs=[-1.0 if m else 0.0 for m in mask], turns=spans, tool_calls=calls, reward=reward,
                      step_rewards=steps)


def test_turn_rewards_put_step_rewards_on_their_turns_and_the_outcome_on_the_last():
    t = _traj("a", 3, 1.5, steps=[0.2, 0.3, 0.0])
    assert turn_rewards(t) == pytest.approx([0.2, 0.3, 1.0])
    assert sum(turn_rewards(t)) == pytest.approx(t.reward)
    assert turn_rewards(_traj("b", 2, 1.0)) == [0.0, 1.0]
    assert returns_to_go([0.2, 0.3, 1.0], 0.5) == pytest.approx([0.2 + 0.5 * (0.3 + 0.5), 0.3 + 0.5, 1.0])


def test_return_baseline_compares_each_turn_with_the_other_trajectories_that_got_there():
    # three trajectories of 1, 2 and 3 turns
    adv = return_baseline_advantages([[1.0], [0.0, 0.0], [3.0, 2.0, 1.0]])
    assert adv[0] == pytest.approx([1.0 - (0.0 + 3.0) / 2])
    assert adv[1] == pytest.approx([0.0 - 2.0, 0.0 - 2.0])  # turn 2: only the third got there
    assert adv[2] == pytest.approx([3.0 - 0.5, 2.0 - 0.0, 1.0 - 0.0])  # turn 3: nobody else: turn 2's baseline
    assert return_baseline_advantages([[1.0, 1.0]]) == [[1.0, 1.0]]  # alone in its group: nothing to compare with


def test_anchor_advantages_group_turns_from_the_same_state_across_trajectories():
    returns = [[1.0, 1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    states = [["start", "A", "B"], ["start", "A"], ["start", "C"]]
    adv = anchor_advantages(returns, states)
    assert adv[0] == pytest.approx([1.0 - 0.5, 1.0 - 0.0, 0.0])  # B: nobody else was there
    assert adv[1] == pytest.approx([0.0 - 1.0, 0.0 - 1.0])
    assert adv[2] == pytest.approx([1.0 - 0.5, 0.0])
    # a state the same trajectory revisits is no company for itself
    assert anchor_advantages([[2.0, 1.0]], [["A", "A"]]) == [[0.0, 0.0]]


def test_turn_states_come_from_the_environment_else_from_the_observation_tokens():
    reported = _traj("a", 3, 0.0, states=["s1", "s2"])
    assert turn_states(reported) == ["start", "env:s1", "env:s2"]
    plain = [_traj(f"b{i}", 3, 0.0, obs=[7, 8 + i]) for i in range(2)]
    s0, s1 = turn_states(plain[0]), turn_states(plain[1])
    assert s0[0] == s1[0] == "start" and s0[1] == s1[1] and s0[2] != s1[2]
    assert s0[1].startswith("obs:")
    failed = _traj("c", 4, 0.0, states=["s1", "s2", "s3"])
    failed.tool_calls[1] = ToolCallRecord(turn=1, name="", is_error=True)  # a malformed call changes nothing
    assert turn_states(failed) == ["start", "env:s1", "env:s1", "env:s3"]


def test_group_advantages_land_on_each_turns_tokens_and_use_the_groups_scale():
    group = [_traj("a", 2, 1.0), _traj("b", 1, 0.0), _traj("c", 3, 0.0), _traj("x", 2, 1.0, group="other")]
    cfg = TurnCreditConfig(estimator="returns")
    raw = turn_advantages(group, cfg, norm_by_std=False, episode=[0.0] * 4)
    assert raw[0] == pytest.approx([1.0 - 0.0, 1.0 - 0.0])
    assert raw[3] == [1.0, 1.0]  # a group of one
    normed = turn_advantages(group, cfg, norm_by_std=True, episode=[0.0] * 4)
    std = float(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0]).std())
    assert normed[0] == pytest.approx([1.0 / (std + 1e-6)] * 2)
    anchors = turn_advantages(group[:3], TurnCreditConfig(estimator="anchors", anchor_weight=0.5), norm_by_std=False,
                              episode=[0.7, -0.3, -0.3])
    assert anchors[0][0] == pytest.approx(0.7 + 0.5 * (1.0 - 0.0))  # the start: the other two returned 0

    trajs = group[:3]
    t_len = max(len(t.response_ids) for t in trajs)
    mask = torch.zeros(3, t_len)
    for i, t in enumerate(trajs):
        mask[i, :len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    tok = token_advantages(trajs, [[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]], (3, t_len), mask)
    assert tok[2].tolist() == [4.0, 4.0, 0.0, 5.0, 5.0, 0.0, 6.0, 6.0]  # tool tokens carry none
    assert tok[0].tolist() == [1.0, 1.0, 0.0, 2.0, 2.0, 0.0, 0.0, 0.0]


def recipe_errors(tmp_path, algorithm: dict) -> dict[str, list[str]]:
    """Per engine (verl, local): what the preflight says of a small recipe with this `algorithm` section."""
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "answer": "1"}\n')
    out = {}
    for engine in ("verl", "local"):
        recipe = {"name": "t", "engine": engine, "model": {"path": "m"}, "data": {"train_file": "train.jsonl"},
                  "rewards": {"functions": [{"function": "exact_match"}]}, "algorithm": algorithm}
        (tmp_path / "r.yaml").write_text(json.dumps(recipe))
        out[engine] = validate_recipe(tmp_path / "r.yaml")
    return out


def test_verl_refuses_turn_credit_before_any_work(tmp_path):
    errors = recipe_errors(tmp_path, {"turn_credit": {"estimator": "returns"}})
    assert any("algorithm.turn_credit.estimator" in e and "engine: local" in e for e in errors["verl"]), errors
    assert not any("turn_credit" in e for e in errors["local"])


# ------------------------------------------------------------------------------------------ the bias test
H, P_CONTINUE, STEP_REWARD = 4, 0.6, 0.5
"""A small MDP: at turns 1..H-1 the policy continues (reward STEP_REWARD) with probability p = sigmoid(theta) or
stops; turn H always stops. Stopping at turn k pays FINAL[k] on top."""
FINAL = {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.5}


def _episode(rng: random.Random) -> int:
    k = 1
    while k < H and rng.random() < P_CONTINUE:
        k += 1
    return k  # the turn it stopped at


def _rewards(k: int) -> list[float]:
    return [STEP_REWARD] * (k - 1) + [FINAL[k]]


def _score(k: int, t: int) -> float:
    """d/dtheta log pi(a_t) at turn t (1-based) of an episode that stopped at k: continue 1-p, stop -p, forced 0."""
    if t < k:
        return 1 - P_CONTINUE
    return -P_CONTINUE if t < H else 0.0


def _true_gradient() -> float:
    g = 0.0
    for k in range(1, H + 1):
        prob = P_CONTINUE ** (k - 1) * ((1 - P_CONTINUE) if k < H else 1.0)
        g += prob * sum(_score(k, t) for t in range(1, k + 1)) * sum(_rewards(k))
    return g


def _naive_per_turn_index(returns_unused: list[list[float]], rewards: list[list[float]]) -> list[list[float]]:
    """MT-GRPO's per-turn-index normalisation (mean only, and leaving each trajectory out of its own means, so that
    the one difference from ours is how many terms the baseline has): r_t minus the mean r_t of the group's other
    trajectories that have a turn t, summed from t to the trajectory's OWN last turn."""
    out = []
    for i, r in enumerate(rewards):
        def mean(u: int) -> float:
            have = [x[u] for j, x in enumerate(rewards) if j != i and len(x) > u]
            return sum(have) / len(have) if have else 0.0
        out.append([sum(r[u] - mean(u) for u in range(t, len(r))) for t in range(len(r))])
    return out


def _mean_gradient(estimator, groups: int, n: int, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    samples = []
    for _ in range(groups):
        ks = [_episode(rng) for _ in range(n)]
        rewards = [_rewards(k) for k in ks]
        returns = [returns_to_go(r, 1.0) for r in rewards]
        adv = estimator(returns, rewards)
        samples.append(sum(_score(k, t + 1) * a[t] for k, a in zip(ks, adv) for t in range(k)) / n)
    mean = sum(samples) / groups
    se = math.sqrt(sum((x - mean) ** 2 for x in samples) / (groups - 1) / groups)
    return mean, se


def test_return_baseline_is_unbiased_where_per_turn_index_normalisation_is_not():
    true = _true_gradient()
    ours, se_ours = _mean_gradient(lambda returns, _r: return_baseline_advantages(returns), 20_000, 6, seed=0)
    naive, se_naive = _mean_gradient(_naive_per_turn_index, 20_000, 6, seed=0)
    assert abs(ours - true) < 4 * se_ours, (ours, true, se_ours)
    assert abs(naive - true) > 10 * se_naive, (naive, true, se_naive)
    assert naive < true  # the hidden penalty on "take another turn" the RFC derives
