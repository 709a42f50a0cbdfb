"""bench/horizons.py's collapse flag: the training reward's 5-step means over full windows only. A first batch that
happened to score well (one step, not a trend) must not count as the best the run reached."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def horizons():
    sys.path.insert(0, str(BENCH))  # it imports env_learning beside it
    try:
        spec = importlib.util.spec_from_file_location("horizons_bench", BENCH / "horizons.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


def test_a_lucky_first_step_is_not_the_best(horizons):
    # TextCraft, fixed 8 turns, seed 1 (2026-12-03): step 1 scored 0.547, then the run rose slowly to ~0.34
    rewards = [0.547, 0.266, 0.297, 0.219, 0.141, 0.188, 0.438, 0.234, 0.3, 0.35, 0.33, 0.36]
    means = horizons.five_step_means(rewards)
    assert len(means) == len(rewards) - 4
    assert means[0] == pytest.approx(sum(rewards[:5]) / 5)
    assert max(means) - means[-1] < 0.2  # no collapse: the best full window is recent


def test_a_real_fall_is_seen(horizons):
    rewards = [0.1] * 5 + [0.6] * 10 + [0.2] * 5
    means = horizons.five_step_means(rewards)
    assert max(means) == pytest.approx(0.6) and means[-1] == pytest.approx(0.2)


def test_short_runs_have_one_mean(horizons):
    assert horizons.five_step_means([0.2, 0.4]) == [pytest.approx(0.3)]
    assert horizons.five_step_means([]) == [0.0]
