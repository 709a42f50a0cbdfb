"""TrajectoryGate: never more slots held than it has, trees of several slots reserved whole (so trees waiting for
room never deadlock each other), and a tree wider than the gate refused with the settings that fix it."""
from __future__ import annotations

import asyncio

import pytest

from rlfactory.errors import ConfigError
from rlfactory.rollout.gate import TrajectoryGate


async def test_trees_and_single_trajectories_share_the_slots_without_deadlock():
    gate = TrajectoryGate(4)
    held, most = 0, 0

    async def hold(n: int) -> None:
        nonlocal held, most
        async with gate.many(n):
            held += n
            most = max(most, held)
            await asyncio.sleep(0.001)
            held -= n

    # 3-wide trees on 4 slots: two trees that each took part of the room would wait for each other forever
    jobs = [hold(3) for _ in range(12)] + [hold(1) for _ in range(20)]
    await asyncio.wait_for(asyncio.gather(*jobs), timeout=20)
    assert most <= 4 and held == 0


async def test_a_tree_wider_than_the_gate_is_refused():
    with pytest.raises(ConfigError, match="rollout.branching.width"):
        async with TrajectoryGate(2).many(3):
            pass
    with pytest.raises(ValueError):
        TrajectoryGate(0)
