"""`algorithm.negative_advantage_scale` (algorithms/credit.py): negative advantages scaled after every other rule
(flat GRPO, turn credit), positive ones untouched, and verl's refusal before any work."""
from __future__ import annotations

import json

import pytest
import torch

from rlfactory.algorithms import credit
from rlfactory.algorithms.grpo import build_batch
from rlfactory.preflight import validate_recipe
from rlfactory.recipe.training import AlgorithmConfig, TurnCreditConfig
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan


def _traj(tid: str, reward: float, turns: int = 2, *, steps: list[float] | None = None) -> Trajectory:
    """`turns` assistant turns of 2 tokens, a tool turn of 1 token between them, in group `g`."""
    ids, mask, spans, calls = [], [], [], []
    for k in range(turns):
        spans.append(TurnSpan(role="assistant", start=len(ids), end=len(ids) + 2))
        ids += [10 + k, 20 + k]
        mask += [1, 1]
        if k < turns - 1:
            spans.append(TurnSpan(role="tool", start=len(ids), end=len(ids) + 1))
            ids.append(99)
            mask.append(0)
            calls.append(ToolCallRecord(turn=k, name="step"))
    return Trajectory(id=tid, group_id="g", prompt_ids=[1, 2], response_ids=ids, loss_mask=mask,
                      logprobs=[-1.0 if m else 0.0 for m in mask], turns=spans, tool_calls=calls, reward=reward,
                      step_rewards=steps)


@pytest.mark.parametrize("turn_credit", ["none", "returns"])
def test_negative_advantages_are_scaled_and_positive_ones_kept(turn_credit):
    kept = [_traj("a", 1.0), _traj("b", 0.0), _traj("c", 0.0, turns=3, steps=[0.5, 0.0, 0.0]), _traj("d", 0.0)]
    batch = build_batch(kept, pad_id=0)
    cfg = {"turn_credit": TurnCreditConfig(estimator=turn_credit)}
    full = credit.advantages(kept, batch, AlgorithmConfig(**cfg))  # [N, T]
    assert (full > 0).any() and (full < 0).any()
    for scale in (0.0, 0.25):
        got = credit.advantages(kept, batch, AlgorithmConfig(negative_advantage_scale=scale, **cfg))
        assert torch.equal(got[full > 0], full[full > 0])  # the better-than-group tokens as GRPO gives them
        assert torch.allclose(got[full < 0], scale * full[full < 0])
        assert torch.equal(got[full == 0], full[full == 0])  # tool tokens and padding carry none
    assert torch.equal(credit.advantages(kept, batch, AlgorithmConfig(negative_advantage_scale=1.0, **cfg)), full)


def test_the_scale_is_checked_and_verl_refuses_it_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="negative_advantage_scale"):
        AlgorithmConfig(negative_advantage_scale=1.5)
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "answer": "1"}\n')
    recipe = {"name": "t", "engine": "verl", "model": {"path": "m"}, "data": {"train_file": "train.jsonl"},
              "rewards": {"functions": [{"function": "exact_match"}]},
              "algorithm": {"negative_advantage_scale": 0.0}}
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    errors = validate_recipe(tmp_path / "r.yaml")
    assert any("algorithm.negative_advantage_scale" in e and "engine: local" in e for e in errors), errors
    recipe["engine"] = "local"
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    assert not any("negative_advantage_scale" in e for e in validate_recipe(tmp_path / "r.yaml"))
