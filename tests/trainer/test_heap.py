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
    before = _Node()
    heap = FrozenHeap()
    frozen = heap.freeze()
    assert frozen == gc.get_freeze_count() > 0
    assert not _tracked(before)
    after = _Node()  # made after the freeze: collected as usual
    assert _tracked(after)
    assert heap.freeze() > frozen  # a second freeze adds what was made since
    assert not _tracked(after)
    heap.thaw()
    assert gc.get_freeze_count() == 0
    assert _tracked(before) and _tracked(after)


def test_a_host_that_froze_its_own_objects_keeps_them_frozen():
    gc.freeze()  # the host process's own freeze, before the run
    host = gc.get_freeze_count()
    heap = FrozenHeap()
    heap.freeze()
    heap.thaw()
    assert gc.get_freeze_count() >= host > 0


def test_frozen_garbage_is_collected_once_thawed():
    gc.collect()
    heap = FrozenHeap()
    _Node()  # garbage already, but frozen with the rest below before any collection
    heap.freeze()
    gc.collect()
    assert gc.get_freeze_count() > 0
    heap.thaw()
    assert gc.collect() >= 1  # the cycle is reachable by the collector again and freed
