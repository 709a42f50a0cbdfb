"""`algorithm.negative_advantage_scale` (algorithms/credit.py): negative advantages scaled after every other rule
(flat GRPO, turn credit), positive ones untouched, and verl's refusal before any work."""
from __future__ import annotations

import pytest
import torch
from test_turn_credit import _traj, recipe_errors  # _traj: turns of 2 tokens, a tool token between

from rlfactory.algorithms import credit
from rlfactory.algorithms.grpo import build_batch
from rlfactory.recipe.training import AlgorithmConfig, TurnCreditConfig


@pytest.mark.parametrize("turn_credit", ["none", "returns"])
def test_negative_advantages_are_scaled_and_positive_ones_kept(turn_credit):
    kept = [_traj("a", 2, 1.0), _traj("b", 2, 0.0), _traj("c", 3, 0.0, steps=[0.5, 0.0, 0.0]), _traj("d", 2, 0.0)]
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
    errors = recipe_errors(tmp_path, {"negative_advantage_scale": 0.0})
    assert any("algorithm.negative_advantage_scale" in e and "engine: local" in e for e in errors["verl"]), errors
    assert not any("negative_advantage_scale" in e for e in errors["local"])
