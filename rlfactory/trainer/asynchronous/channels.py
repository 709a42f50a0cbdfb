"""`Channels`: everything the trainer and its generator process share, in one typed object made by the trainer
before the spawn and handed to the generator whole (locks and pipes reach a spawned process only as arguments of
the spawn).

    results        generator -> trainer   ("ready" | "group" | "dropped" | "pulse" | "error", record): messages.py
    setup          trainer -> generator   the Setup, once the run folder is ready (a pipe: a record that cannot
                                          travel fails in the sender, loudly)
    stop           trainer -> generator   shut down (close the tool servers, exit)
    weights_lock                          makes a push and a load of SharedWeights exclusive
    released                              groups the trainer let go (dropped, or skipped in an outage): they free
                                          their places under the staleness bound (staleness.py)
    helper_messages, helper_lock          an optional helper's own traffic, trainer -> generator, and its lock
                                          (messages.HelperSpec; shared_update.py)

Left out: what travels on them (messages.py), the weights themselves (weights.py, shared memory).
"""
from __future__ import annotations

import contextlib
import queue as queue_mod
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from typing import Any

from rlfactory.trainer.asynchronous.messages import Message


@dataclass
class Channels:
    results: Any
    """A `multiprocessing.Queue` of `messages.Message`."""
    stop: Any
    """A `multiprocessing.Event`."""
    setup_recv: Connection
    setup_send: Connection
    weights_lock: Any
    released: Any
    """A `multiprocessing.Value("q")`: groups the trainer let go."""
    helper_messages: Any
    """A `multiprocessing.Queue` for an optional helper (messages.HelperSpec)."""
    helper_lock: Any

    @classmethod
    def make(cls, ctx: SpawnContext) -> Channels:
        setup_recv, setup_send = ctx.Pipe(duplex=False)
        return cls(results=ctx.Queue(), stop=ctx.Event(), setup_recv=setup_recv, setup_send=setup_send,
                   weights_lock=ctx.Lock(), released=ctx.Value("q", 0), helper_messages=ctx.Queue(),
                   helper_lock=ctx.Lock())

    def drain(self, timeout_s: float) -> list[Message]:
        """Messages waiting on `results` within `timeout_s` (the first blocks, the rest do not)."""
        out: list[Message] = []
        try:
            out.append(self.results.get(timeout=timeout_s))
            while True:
                out.append(self.results.get_nowait())
        except queue_mod.Empty:
            pass
        return out

    def close(self) -> None:
        """The trainer's ends, once the generator is gone."""
        for q in (self.results, self.helper_messages):
            with contextlib.suppress(Exception):
                q.cancel_join_thread()
                q.close()
        for end in (self.setup_recv, self.setup_send):
            with contextlib.suppress(Exception):
                end.close()
