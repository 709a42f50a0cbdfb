"""Horizon schedules are pure functions of the global step (resume-aware)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from rlfactory.recipe.rollout import FixedHorizon, HorizonConfig, RolloutConfig, ScalingInterHorizon
from rlfactory.rollout.horizon import horizon_for_step, max_horizon, stage_for_step


def test_fixed_is_constant():
    cfg = FixedHorizon(turns=5)
    assert [horizon_for_step(cfg, s) for s in (0, 1, 99, 10_000)] == [5, 5, 5, 5]
    assert stage_for_step(cfg, 1234) == 0
    assert max_horizon(cfg) == 5


def test_scaling_inter_advances_then_stays_on_last():
    cfg = ScalingInterHorizon(horizons=[2, 4, 8], interval_steps=10)
    got = [horizon_for_step(cfg, s) for s in range(0, 45, 5)]
    #        steps 0  5 10 15 20 25 30 35 40
    assert got == [2, 2, 4, 4, 8, 8, 8, 8, 8]
    assert [stage_for_step(cfg, s) for s in (9, 10, 19, 20, 1000)] == [0, 1, 1, 2, 2]
    assert max_horizon(cfg) == 8


@given(
    horizons=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    interval=st.integers(1, 30),
    step=st.integers(0, 10_000),
)
def test_scaling_inter_resume_matches_a_run_from_zero(horizons, interval, step):
    """A run resumed at `step` sees exactly the horizon a run that never stopped would see there."""
    cfg = ScalingInterHorizon(horizons=horizons, interval_steps=interval)
    stage = 0
    for s in range(0, step + 1):  # simulate: advance every `interval` steps, clamp at the last stage
        if s > 0 and s % interval == 0:
            stage = min(stage + 1, len(horizons) - 1)
    assert stage_for_step(cfg, step) == stage
    assert horizon_for_step(cfg, step) == horizons[stage]


def test_recipe_yaml_shapes_parse_by_discriminator():
    adapter = TypeAdapter(HorizonConfig)
    assert isinstance(adapter.validate_python({"type": "fixed", "turns": 3}), FixedHorizon)
    cfg = adapter.validate_python({"type": "scaling_inter", "horizons": [1, 2], "interval_steps": 5})
    assert horizon_for_step(cfg, 5) == 2
    rc = RolloutConfig.model_validate({"horizon": {"type": "scaling_inter", "horizons": [3], "interval_steps": 1}})
    assert horizon_for_step(rc.horizon, 7) == 3


def test_bad_schedules_are_rejected():
    with pytest.raises(ValidationError):
        ScalingInterHorizon(horizons=[], interval_steps=1)
    with pytest.raises(ValidationError):
        ScalingInterHorizon(horizons=[2, 0], interval_steps=1)
    with pytest.raises(ValidationError):
        ScalingInterHorizon(horizons=[2], interval_steps=0)
    with pytest.raises(ValueError):
        stage_for_step(FixedHorizon(), -1)
