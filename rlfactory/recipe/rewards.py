"""The `rewards:` section of a recipe: which reward functions, their weights, and what a failed one scores.
The functions are loaded and run by rlfactory/reward/."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from rlfactory.recipe.section import Section


class RewardSpec(Section):
    """One reward entry of a recipe."""

    function: str
    """A registered name (e.g. `exact_match`), a dotted path (`pkg.mod:func` or `pkg.mod.func`), or
    `path/to/file.py:func` relative to the recipe."""
    weight: float = 1.0
    """Weight in the trained reward; 0 = logged as a metric only."""
    name: str | None = None
    """Name in metrics (`reward/<name>`); defaults to the function's name."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to the function."""


class RewardsConfig(Section):
    """The `rewards:` section of a recipe."""

    functions: list[RewardSpec] = Field(default_factory=list)
    """Reward functions and their weights."""
    failure_value: float = 0.0
    """Score given to a sample whose reward function raised (the sample is also flagged and counted)."""
    max_concurrency: int = Field(64, ge=1)
    """Reward calls in flight at once (matters for LLM judges)."""
