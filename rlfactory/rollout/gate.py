"""`TrajectoryGate`: how many trajectories a rollout has in flight, so that no environment server is asked to hold
more episodes than it can.

An environment server keeps at most `--max-episodes` episodes open and evicts the least recently used one to open
another (rlfactory/envs/episodes.py); a trajectory whose episode was evicted mid-play would be cut short. Servers say
how many they hold (`ToolSpec.max_episodes`, from their tool list), and the gate's size is the least of that and
`rollout.max_concurrent_trajectories`. A trajectory holds one slot while its episode is open (`one`); a branched
tree holds one slot per branch for its whole life (`many(width)`: the root's episode and its forks are open
together), reserved all at once so that trees waiting for slots never hold part of them.

Left out: what the slots are for (the AgentLoop), the servers' registry (envs/episodes.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, AsyncIterator

from rlfactory.errors import ConfigError

if TYPE_CHECKING:
    from rlfactory.tools.manager import ToolManager

logger = logging.getLogger(__name__)
_SAID: set[tuple[int, int]] = set()
"""The lowerings logged already (once a process: a training run sizes a gate every step)."""


def episode_capacity(tools: "ToolManager | None") -> int | None:
    """The fewest episodes any of the manager's environment servers holds open at once (None: none says)."""
    if tools is None:
        return None
    specs = [*getattr(tools, "specs", []), *getattr(tools, "loop_specs", [])]
    sizes = [s.max_episodes for s in specs if s.max_episodes]
    return min(sizes) if sizes else None


class TrajectoryGate:
    """`slots` trajectories in flight at once: `async with gate.one()` for one, `gate.many(n)` for a tree of n."""

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError("a trajectory gate needs at least one slot")
        self.slots = slots
        self._free = asyncio.Semaphore(slots)
        self._reserving = asyncio.Lock()

    @classmethod
    def sized(cls, max_concurrent: int, tools: "ToolManager | None") -> "TrajectoryGate":
        """`rollout.max_concurrent_trajectories`, lowered to the episodes the servers hold (logged when it is)."""
        capacity = episode_capacity(tools)
        if capacity is None or capacity >= max_concurrent:
            return cls(max_concurrent)
        if (capacity, max_concurrent) not in _SAID:
            _SAID.add((capacity, max_concurrent))
            logger.info("at most %d trajectories at once (rollout.max_concurrent_trajectories %d): an environment "
                        "server holds %d open episodes (--max-episodes)", capacity, max_concurrent, capacity)
        return cls(capacity)

    def one(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.many(1)

    @contextlib.asynccontextmanager
    async def many(self, n: int) -> AsyncIterator[None]:
        """Hold `n` slots together (a branched tree's branches); refused when the gate has fewer."""
        if n > self.slots:
            raise ConfigError(f"a branched group's tree plays {n} branches at once, but only {self.slots} "
                              f"trajectories may be in flight (rollout.max_concurrent_trajectories, or an environment "
                              f"server's --max-episodes): lower rollout.branching.width or raise the limit")
        if n == 1:
            async with self._free:
                yield
            return
        async with self._reserving:  # one reservation at a time: two trees never each hold part of what they need
            for _ in range(n):
                await self._free.acquire()
        try:
            yield
        finally:
            for _ in range(n):
                self._free.release()
