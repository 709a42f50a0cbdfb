"""Training: GRPO glue over verl's core_algos, the local engine loop, SFT warm-up, checkpoints, the verl engine.

`rlfactory.train` is both this package and the API function `rlfactory.train(recipe)`: once the package is imported,
Python binds the attribute `rlfactory.train` to it, so the package itself is made callable (it forwards to
`rlfactory.api.train`) and `rlfactory.train(recipe)` works either way.
"""
from __future__ import annotations

import sys
import types
from typing import Any


class _CallableTrainPackage(types.ModuleType):
    def __call__(self, recipe: Any, **kwargs: Any) -> Any:
        """`rlfactory.train(recipe, resume=False, progress=False, dry_run=False)`: see `rlfactory.api.train`."""
        from rlfactory.api import train

        return train(recipe, **kwargs)


sys.modules[__name__].__class__ = _CallableTrainPackage
