"""The trainer's side of the generator process (generator.py): spawn it, split the CPUs, hand it the shared weights
and the data position, read its results, stop it.

The process is spawned right after the recipe is validated, before the trainer imports torch (api.train), so this
module stays light: no torch, no transformers. Left out: several generator processes.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_mod
import time
from typing import TYPE_CHECKING, Any

from rlfactory.trainer.generator import GeneratorSpec, Setup, generator_main

if TYPE_CHECKING:
    from rlfactory.recipe.schema import Recipe

logger = logging.getLogger(__name__)

__all__ = ["GeneratorLaunch", "Setup", "drain"]


class GeneratorLaunch:
    """The generator process and its channels, as the trainer holds them."""

    def __init__(self, recipe: "Recipe"):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.ctx = ctx
        self.results, self.stop_event = ctx.Queue(), ctx.Event()
        # a pipe, not a queue: send() pickles in the caller, so a message that cannot travel fails there, loudly
        self._setup_in, self._setup_out = ctx.Pipe(duplex=False)
        self.lock = ctx.Lock()
        """The SharedWeights lock (a lock reaches a spawned process only as an argument of the spawn)."""
        self.jobs_lock = ctx.Lock()
        """The UpdateJobs lock (trainer.update_on_generator)."""
        self.job_messages = ctx.Queue()
        """The trainer's job descriptions and step openings, for the generator's UpdateHelper."""
        self._wake_in, self._wake_out = ctx.Pipe(duplex=False)
        """A byte after each weight push wakes the generator's event loop at once (its own poll is a fallback)."""
        self.trainer_drops = ctx.Value("q", 0)
        """Groups the trainer dropped (they free their places under the staleness bound)."""
        spec = GeneratorSpec(recipe=recipe, run_dir=str(recipe.trainer.output_dir), parent_pid=os.getpid())
        self._cpus: list[int] | None = None  # this process's CPUs before the split (restored by stop)
        self.engine_cpus: list[int] | None = None
        self.proc = ctx.Process(target=generator_main, name="rlfactory-generator", daemon=True,
                                args=(spec, self.results,
                                      (self._setup_in, self.lock, self.jobs_lock, self.job_messages,
                                       self._wake_in),
                                      self.stop_event, self.trainer_drops))

    @classmethod
    def start(cls, recipe: "Recipe") -> "GeneratorLaunch":
        launch = cls(recipe)
        launch.proc.start()
        if recipe.trainer.split_cores:
            launch._split_cores()
        return launch

    def _split_cores(self) -> None:
        """Keep the first half of this process's CPUs here and give the generator's decoding thread the second
        half (`engine_cpus`, sent with the Setup), so the update and the decoding never take turns on one core.
        The generator's event loop and its tool servers are not pinned: they run where a CPU is free."""
        if not hasattr(os, "sched_getaffinity"):
            return
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return
        half = len(cpus) // 2
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus[:half])
            self._cpus = cpus
            self.engine_cpus = cpus[half:]
            logger.info("CPUs: trainer %s, generator's decoding %s", cpus[:half], cpus[half:])

    def setup(self, setup: Setup) -> None:
        self._setup_out.send(setup)

    def wake(self) -> None:
        """Tell the generator that new weights are published (it starts the groups they allow right away)."""
        with contextlib.suppress(OSError, ValueError):  # a generator that is gone is reported by its process
            self._wake_out.send_bytes(b"w")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the generator to close its tool servers and exit; terminate it if it does not."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        while self.proc.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                drain(self.results, 0.1)  # a full queue would keep its feeder thread, and the process, alive
        if self.proc.is_alive():
            logger.warning("the generator process did not stop within %.0f s; terminating it", timeout_s)
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        for q in (self.results, self.job_messages):
            with contextlib.suppress(Exception):
                q.cancel_join_thread()
                q.close()
        if self._cpus is not None:  # a Python caller's process goes on after the run with all its CPUs
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._cpus)
            self._cpus = None
        for end in (self._setup_in, self._setup_out, self._wake_in, self._wake_out):
            with contextlib.suppress(Exception):
                end.close()


def drain(results: Any, timeout_s: float) -> list[tuple[str, Any]]:
    """Messages waiting on `results` within `timeout_s` (the first blocks, the rest do not)."""
    out: list[tuple[str, Any]] = []
    try:
        out.append(results.get(timeout=timeout_s))
        while True:
            out.append(results.get_nowait())
    except queue_mod.Empty:
        pass
    return out
