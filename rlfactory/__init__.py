"""rlfactory: train LLM agents to use tools (MCP servers) with reinforcement learning.

Heavy submodules (torch, transformers, mcp, verl) are imported lazily so that `import rlfactory` and the CLI stay fast.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "redis_cache", "RLFactory", "Recipe", "train"]


def __getattr__(name: str):
    # Lazy re-exports: keep `import rlfactory` cheap for tool servers and the CLI.
    if name == "redis_cache":
        from rlfactory.tools.cache.decorator import redis_cache

        return redis_cache
    if name == "RLFactory":
        from rlfactory.api import RLFactory

        return RLFactory
    if name == "Recipe":
        from rlfactory.recipe.schema import Recipe

        return Recipe
    if name == "train":
        from rlfactory.api import train

        return train
    raise AttributeError(f"module 'rlfactory' has no attribute {name!r}")
