"""The generator's trajectory slots: never more holders than slots, waiters let in lowest key first whatever order
they came in, and a waiter cancelled (a dropped group) neither keeps a slot nor blocks the others."""
from __future__ import annotations

import asyncio

import pytest

from rlfactory.trainer.asynchronous.ordered_slots import OrderedSlots


async def test_waiters_get_slots_lowest_key_first_and_never_more_than_n():
    slots = OrderedSlots(2)
    order: list[tuple[int, int]] = []
    most = 0
    release = {key: asyncio.Event() for key in [(9, 0), (9, 1), (3, 1), (1, 0), (3, 0), (2, 5)]}

    async def run(key: tuple[int, int]) -> None:
        nonlocal most
        async with slots.hold(key):
            order.append(key)
            most = max(most, slots.held)
            await release[key].wait()

    # the two first arrivals take the free slots; the others queue in the order they arrive here
    tasks = [asyncio.create_task(run(key)) for key in release]
    await asyncio.sleep(0)
    assert order == [(9, 0), (9, 1)] and slots.free == 0
    for key in list(release):
        release[key].set()
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert order == [(9, 0), (9, 1), (1, 0), (2, 5), (3, 0), (3, 1)]
    assert most == 2 and slots.free == 2


async def test_a_cancelled_waiter_or_holder_gives_its_slot_to_the_next_key():
    slots = OrderedSlots(1)
    got: list[int] = []
    hold_first = asyncio.Event()

    async def run(key: int, wait: asyncio.Event | None = None) -> None:
        async with slots.hold(key):
            got.append(key)
            if wait is not None:
                await wait.wait()

    first = asyncio.create_task(run(0, hold_first))
    await asyncio.sleep(0)
    doomed = asyncio.create_task(run(1))  # waits, then is dropped
    later = asyncio.create_task(run(2))
    await asyncio.sleep(0)
    doomed.cancel()
    hold_first.set()
    await asyncio.gather(first, later)
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert got == [0, 2] and slots.free == 1

    # a holder cancelled mid-trajectory releases its slot too
    block = asyncio.Event()
    holder = asyncio.create_task(run(5, block))
    await asyncio.sleep(0)
    assert slots.free == 0
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert slots.free == 1
    with pytest.raises(ValueError, match="at least one slot"):
        OrderedSlots(0)
