"""The seam an optional helper of the generator process plugs into (`trainer.update_on_generator`'s
shared_update.py is the one there is): what a helper does for the generator's loop, and how the generator finds it
from the name in its spec (`messages.HelperSpec`) without the core importing the helper's module.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from rlfactory.recipe.schema import Recipe
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.trainer.asynchronous.channels import Channels
from rlfactory.trainer.asynchronous.messages import GeneratorSpec
from rlfactory.trainer.asynchronous.weights import SharedWeights


class GeneratorHelper(Protocol):
    """Optional work this process does for the trainer (messages.HelperSpec names its factory)."""

    def keep(self, index: int, trajectories: list[Trajectory]) -> None:
        """Group `index` was sent to the trainer."""
        ...

    def forget(self, index: int) -> None:
        """Group `index` was cancelled (it never reaches the trainer)."""
        ...

    def idle(self, idle: bool) -> None:
        """Whether the generator has nothing in flight now (its core is free)."""
        ...

    @property
    def seconds(self) -> float:
        """Seconds of work done so far (the generator's idle time does not count them)."""
        ...

    def close(self) -> None: ...


HelperFactory = Callable[[Channels, Recipe, Any, Any, Any, SharedWeights, list[int] | None], GeneratorHelper | None]
"""What a `HelperSpec.factory` names:
(channels, recipe, model, tokenizer, device, weights, cpus) -> a helper or None."""


def helper_factory(spec: GeneratorSpec) -> HelperFactory | None:
    """The factory the spec names, its module imported (by name: the core never imports a helper's module); None
    without a helper."""
    if spec.helper is None:
        return None
    module, _, name = spec.helper.factory.partition(":")
    return getattr(importlib.import_module(module), name)
