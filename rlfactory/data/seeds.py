"""Seeds derived from a run's seed: one per group, trajectory and turn, from a few integers, so that no two collide
and the same run draws the same samples (the loops, the generator process, evaluation and verl's workers all use it).
"""
from __future__ import annotations


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps): per-trajectory and per-turn seeds that do not collide."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x >> 1
