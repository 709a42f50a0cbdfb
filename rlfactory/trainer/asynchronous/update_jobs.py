"""The shared update's job board (shared_update.py): the jobs of one step and the generator's gradient, in shared
memory, with one lock. The trainer offers and claims jobs from the front; the generator steals the last open one and
posts the summed gradient of those it ran once the step is closed. Each job is claimed exactly once.

Left out: what a job is (its rows: shared_update.py and streamed.py) and how the two sides learn of jobs (the jobs
queue).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rlfactory.algorithms.off_policy import CorrectionTotals
from rlfactory.trainer.asynchronous.weights import trainable_parameters
from rlfactory.trainer.update import MicroTotals

OPEN, TRAINER, GENERATOR, GENERATOR_DONE = 0, 1, 2, 3
"""A job's state: offered, claimed by the trainer, taken by the generator, run by the generator."""
MAX_JOBS = 4096
"""Jobs one step may offer; later micro-batches run on the trainer alone."""
STEP, JOBS, CLOSED, POSTED = range(4)
"""The header's fields: the step whose jobs these are, how many were offered, whether the step is closed (no more
claims), and the last step whose generator gradient is in the buffers."""


@dataclass
class UpdatePart:
    """What the generator's jobs of one step added up (sent with the step once their gradient is posted)."""

    step: int
    jobs: int = 0
    rows: int = 0
    seconds: float = 0.0
    acc: MicroTotals = field(default_factory=MicroTotals)
    totals: CorrectionTotals = field(default_factory=CorrectionTotals)


class UpdateJobs:
    """The job table and the gradient buffers in shared memory; made by the trainer from its model, handed to the
    generator whole (as handles) on the jobs queue. The lock reaches the generator at its spawn (`with_lock`)."""

    def __init__(self, grads: dict[str, torch.Tensor], state: torch.Tensor, header: torch.Tensor, lock: Any):
        self.grads = grads
        self.state = state  # int8[MAX_JOBS]
        self.header = header  # int64[4]
        self._lock = lock

    @classmethod
    def from_model(cls, model: Any, lock: Any) -> UpdateJobs:
        grads = {name: torch.zeros(p.shape, dtype=p.dtype).share_memory_()
                 for name, p in trainable_parameters(model).items()}
        header = torch.tensor([-1, 0, 1, -1], dtype=torch.int64).share_memory_()
        return cls(grads, torch.zeros(MAX_JOBS, dtype=torch.int8).share_memory_(), header, lock)

    def __getstate__(self) -> dict[str, Any]:  # sent in a message: tensors as handles, the lock left behind
        return {"grads": self.grads, "state": self.state, "header": self.header}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.grads, self.state, self.header, self._lock = state["grads"], state["state"], state["header"], None

    def with_lock(self, lock: Any) -> UpdateJobs:
        self._lock = lock
        return self

    # ------------------------------------------------------------------------------------------------ trainer
    def open(self, step: int) -> None:
        with self._lock:
            self.state.zero_()
            self.header[JOBS] = 0
            self.header[STEP] = step
            self.header[CLOSED] = 0

    def add_job(self, job: int) -> bool:
        """Offer job `job` (numbered 0, 1, ... within a step, described on the jobs queue first); False past
        MAX_JOBS."""
        if job >= MAX_JOBS:
            return False
        with self._lock:
            self.state[job] = OPEN
            self.header[JOBS] = job + 1
            return True

    def claim(self, job: int) -> bool:
        with self._lock:
            if int(self.state[job]) != OPEN:
                return False
            self.state[job] = TRAINER
            return True

    def close(self) -> int:
        """No more claims; how many jobs the generator took."""
        with self._lock:
            self.header[CLOSED] = 1
            n = int(self.header[JOBS])
            return int(((self.state[:n] == GENERATOR) | (self.state[:n] == GENERATOR_DONE)).sum())

    def posted(self, step: int) -> bool:
        return int(self.header[POSTED]) == step

    def add_posted_into(self, params: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, buf in self.grads.items():
                p = params[name]
                if p.grad is None:
                    p.grad = buf.clone()
                else:
                    p.grad.add_(buf)

    # ------------------------------------------------------------------------------------------------ generator
    def steal(self, known: set[tuple[int, int]]) -> tuple[int, int] | None:
        """(step, job) of the last open job, taken for the generator while the step is not closed and (step, job)
        is in `known`; None otherwise."""
        with self._lock:
            if int(self.header[CLOSED]):
                return None
            n = int(self.header[JOBS])
            open_jobs = (self.state[:n] == OPEN).nonzero().flatten().tolist()
            step = int(self.header[STEP])
            if not open_jobs or (step, open_jobs[-1]) not in known:
                return None
            self.state[open_jobs[-1]] = GENERATOR
            return step, open_jobs[-1]

    def done(self, job: int) -> None:
        with self._lock:
            self.state[job] = GENERATOR_DONE

    def due(self) -> int | None:
        """The step whose generator gradient should be posted now (closed, jobs taken here, none running, not
        posted yet), else None."""
        with self._lock:
            step = int(self.header[STEP])
            if not int(self.header[CLOSED]) or int(self.header[POSTED]) == step:
                return None
            states = self.state[:int(self.header[JOBS])]
            if bool((states == GENERATOR).any()) or not bool((states == GENERATOR_DONE).any()):
                return None
            return step

    def post(self, params: dict[str, torch.Tensor], step: int) -> None:
        with self._lock, torch.no_grad():
            for name, buf in self.grads.items():
                g = params[name].grad
                if g is None:
                    buf.zero_()
                else:
                    buf.copy_(g)
            self.header[POSTED] = step
