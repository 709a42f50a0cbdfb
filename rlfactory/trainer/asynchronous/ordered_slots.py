"""`OrderedSlots`: at most n holders at once, and whoever waits is let in lowest key first.

The generator of an asynchronous run holds one slot for each turn it generates, keyed by group number. With as many
slots as one step's trajectories, the groups the trainer needs next run at the engine's full speed and the next
step's fill the rows theirs leave; a trajectory waiting for a tool holds none. Without an order every group started
runs at once: on a CPU a decode step's cost grows with its rows, so all of them finish together and late, and the
trainer waits for the whole lot (bench/README.md has what that cost on TextCraft).
"""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator
from typing import Any


class OrderedSlots:
    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"OrderedSlots needs at least one slot, got {n}")
        self.n = n
        self.free = n
        self._waiting: list[tuple[Any, int, asyncio.Future]] = []
        self._seq = itertools.count()

    @property
    def held(self) -> int:
        return self.n - self.free

    @contextlib.asynccontextmanager
    async def hold(self, key: Any) -> AsyncIterator[None]:
        """Hold a slot for the block; while none is free, wait behind every waiter with a lower key."""
        if self.free > 0 and not self._waiting:
            self.free -= 1
        else:
            fut = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (key, next(self._seq), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # handed a slot as it was cancelled: pass the slot on
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():  # a cancelled waiter's future is done: skip it
                fut.set_result(None)
                return
        self.free += 1
