"""The trainer's side of the generator process (generator.py): spawn it, split the CPUs, hand it the Setup, stop it.

The process is spawned right after the recipe is validated, before the trainer imports torch (api.train), so that
both import torch and load their models in parallel; this module stays light (no torch, no transformers), and the
generator's own imports happen in the child. Left out: several generator processes.
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import time

from rlfactory.recipe.schema import Recipe
from rlfactory.trainer.asynchronous.channels import Channels
from rlfactory.trainer.asynchronous.messages import GeneratorSpec, HelperSpec, Setup

logger = logging.getLogger(__name__)


def _generator_process(spec: GeneratorSpec, channels: Channels) -> None:
    """The spawned process's entry point."""
    # imported here: the generator's module imports torch and the engines, which the trainer's process loads later
    from rlfactory.trainer.asynchronous.generator import generator_main

    generator_main(spec, channels)


class GeneratorLaunch:
    """The generator process and its channels, as the trainer holds them."""

    def __init__(self, recipe: Recipe, helper: HelperSpec | None = None):
        ctx = mp.get_context("spawn")
        self.channels = Channels.make(ctx)
        spec = GeneratorSpec(recipe=recipe, run_dir=str(recipe.trainer.output_dir), parent_pid=os.getpid(),
                             helper=helper)
        self._cpus: list[int] | None = None  # this process's CPUs before the split (restored by stop)
        self.engine_cpus: list[int] | None = None
        # vLLM's engine starts processes of its own, which a daemonic process may not: it is stopped by `stop`, by
        # its parent-death signal and by its parent watch instead (generator.py)
        self.proc = ctx.Process(target=_generator_process, name="rlfactory-generator",
                                daemon=recipe.rollout.engine != "vllm", args=(spec, self.channels))

    @classmethod
    def start(cls, recipe: Recipe, helper: HelperSpec | None = None) -> GeneratorLaunch:
        """Spawn the generator; `helper`: optional work it does for the trainer (messages.HelperSpec)."""
        launch = cls(recipe, helper)
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
        self.channels.setup_send.send(setup)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the generator to close its tool servers and exit; terminate it if it does not."""
        self.channels.stop.set()
        deadline = time.monotonic() + timeout_s
        while self.proc.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                self.channels.drain(0.1)  # a full queue would keep its feeder thread, and the process, alive
        if self.proc.is_alive():
            logger.warning("the generator process did not stop within %.0f s; terminating it", timeout_s)
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.channels.close()
        if self._cpus is not None:  # a Python caller's process goes on after the run with all its CPUs
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._cpus)
            self._cpus = None
