"""Python's cyclic garbage collector in a training process (`FrozenHeap`).

Before its first step a training process has imported torch, transformers and the MCP SDK and loaded the model:
hundreds of thousands of objects that live until the run ends. Each full collection walks all of them again while
holding the GIL, which stalls the decoding thread or the update in the middle of a step. Once set-up is done they
are frozen: moved out of the collector's generations, so later collections walk only what the steps allocate
(bench/README.md has what a full collection cost before and after). Objects made afterwards are collected as
before. A run inside a longer-lived process (the Python API, tests) thaws them again when it ends, so nothing stays
out of the collector's reach for good.
"""
from __future__ import annotations

import gc


class FrozenHeap:
    """`freeze()` once set-up is done (again after more of it: each call freezes what was made since); `thaw()` when
    the run ends. The heap is thawed only when nothing was frozen before this object was made: a host process that
    freezes its own objects keeps them frozen."""

    def __init__(self) -> None:
        self.owned = gc.get_freeze_count() == 0

    def freeze(self) -> int:
        """Freeze every object tracked now (no collection first: that would cost the full pass this avoids). Returns
        how many objects are frozen in all."""
        gc.freeze()
        return gc.get_freeze_count()

    def thaw(self) -> None:
        if self.owned:
            gc.unfreeze()
