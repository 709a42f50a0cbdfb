"""FrozenHeap: what a training run freezes once set-up is done, and thaws when it ends."""
from __future__ import annotations

import gc

import pytest

from rlfactory.trainer.heap import FrozenHeap


@pytest.fixture(autouse=True)
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def _tracked(obj: object) -> bool:
    """Whether `obj` is in one of the collector's generations (frozen objects are in none)."""
    return any(o is obj for g in (0, 1, 2) for o in gc.get_objects(generation=g))


def test_freeze_moves_the_heap_out_of_the_collector_and_thaw_returns_it():
    # which objects are tracked, not counts: another thread (pytest's, asyncio's) may free a frozen object at any time,
    # and that lowers the freeze count
    before = _Node()
    heap = FrozenHeap()
    assert heap.owned and heap.freeze() > 0
    assert not _tracked(before)
    after = _Node()  # made after the freeze: collected as usual
    assert _tracked(after)
    heap.freeze()  # a second freeze adds what was made since
    assert not _tracked(after) and not _tracked(before)
    heap.thaw()
    assert gc.get_freeze_count() == 0
    assert _tracked(before) and _tracked(after)


def test_a_host_that_froze_its_own_objects_keeps_them_frozen():
    host_object = _Node()
    gc.freeze()  # the host process's own freeze, before the run
    heap = FrozenHeap()
    assert not heap.owned
    heap.freeze()
    run_object = _Node()
    heap.thaw()
    assert gc.get_freeze_count() > 0 and not _tracked(host_object)
    assert _tracked(run_object)


def test_frozen_garbage_is_collected_once_thawed():
    gc.collect()
    heap = FrozenHeap()
    _Node()  # garbage already, but frozen with the rest below before any collection
    heap.freeze()
    gc.collect()
    assert gc.get_freeze_count() > 0
    heap.thaw()
    assert gc.collect() >= 1  # the cycle is reachable by the collector again and freed
