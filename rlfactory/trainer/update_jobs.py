"""`UpdateJobs`: an asynchronous step's forward/backward cut into jobs that the trainer and the generator process
share (`trainer.update_on_generator`).

On 2 cores the trainer's update is what an asynchronous run waits for, while the generator's decoding core idles
once it has generated everything the staleness bound allows. So the step built as groups arrive
(streamed_update.py) announces each micro-batch as a job:

    trainer                                             generator (its decoding thread, while its engine idles)
    -------                                             ---------------------------------------------------------
    open(step)  (after publishing that step's weights)
    describe job j on the jobs queue, add_job(j) --->  knows the job (it holds the groups' trajectories)
    claim(j) in order, run it                            steal(): the LAST open job
    close() once every group is in and no job is open    run it on its own copy of the weights, mark it done
    wait for posted == step, add the posted gradient <-- post(): its jobs' summed gradient, once closed and done

Each job is claimed once, under one lock, so every micro-batch is computed exactly once, by one side; losses are
sums (normaliser 1, streamed_update.py) and the trainer divides the total, so the gradient is the step's own, up to
float rounding in the order of additions. The generator steals from the end while the trainer works from the
front: with both cores as fast, a stolen job starts before the trainer would have reached it.
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Any

import torch

from rlfactory.trainer.weight_push import trainable_parameters

OPEN, TRAINER, GENERATOR, GENERATOR_DONE = 0, 1, 2, 3
JOB_ROWS, TAIL_JOBS = 8, 2
"""A shared step cuts the last TAIL_JOBS x JOB_ROWS rows of each arrival (its longest) into jobs of JOB_ROWS rows,
and the rest into micro-batches as usual: the generator, idle late in the step, takes small jobs from the end, so
the side finishing last waits little for the other, while the trainer's first jobs stay large (each micro-batch
costs ~20 ms on top of its rows)."""
MAX_JOBS = 4096
"""Jobs one step may announce; later ones run on the trainer alone."""
STEP, JOBS, CLOSED, POSTED = range(4)
"""The header's fields: the step whose jobs these are, how many were announced, whether the step is closed (no
more claims), and the last step whose generator gradient is in the buffers."""


class UpdateJobs:
    """Made by the trainer from its model (`from_model`), handed to the generator process whole (as handles)."""

    def __init__(self, grads: dict[str, torch.Tensor], state: torch.Tensor, header: torch.Tensor, lock: Any):
        self.grads = grads
        self.state = state  # int8[MAX_JOBS]
        self.header = header  # int64[4]
        self._lock = lock

    @classmethod
    def from_model(cls, model: Any, lock: Any = None) -> "UpdateJobs":
        grads = {name: torch.zeros(p.shape, dtype=p.dtype).share_memory_()
                 for name, p in trainable_parameters(model).items()}
        header = torch.tensor([-1, 0, 1, -1], dtype=torch.int64).share_memory_()
        lock = lock if lock is not None else mp.get_context("spawn").Lock()
        return cls(grads, torch.zeros(MAX_JOBS, dtype=torch.int8).share_memory_(), header, lock)

    def __getstate__(self) -> dict[str, Any]:  # sent in a message: tensors as handles, the lock left behind
        return {"grads": self.grads, "state": self.state, "header": self.header}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.grads, self.state, self.header, self._lock = state["grads"], state["state"], state["header"], None

    def with_lock(self, lock: Any) -> "UpdateJobs":
        self._lock = lock
        return self

    # ------------------------------------------------------------------------------------------------ trainer
    def open(self, step: int) -> None:
        """Start announcing jobs of the step at policy version `step`."""
        with self._lock:
            self.state.zero_()
            self.header[JOBS] = 0
            self.header[STEP] = step
            self.header[CLOSED] = 0

    def add_job(self, job: int) -> bool:
        """Open job number `job` (the trainer numbers them 0, 1, ... within a step, and describes each on the jobs
        queue first); False past MAX_JOBS (the trainer runs it alone)."""
        if job >= MAX_JOBS:
            return False
        with self._lock:
            self.state[job] = OPEN
            self.header[JOBS] = job + 1
            return True

    def claim(self, job: int) -> bool:
        """Take job `job` for the trainer; False when the generator has it."""
        with self._lock:
            if int(self.state[job]) != OPEN:
                return False
            self.state[job] = TRAINER
            return True

    def close(self) -> int:
        """No more claims; how many jobs the generator took (their gradient comes with `posted`)."""
        with self._lock:
            self.header[CLOSED] = 1
            n = int(self.header[JOBS])
            return int(((self.state[:n] == GENERATOR) | (self.state[:n] == GENERATOR_DONE)).sum())

    def posted(self, step: int) -> bool:
        return int(self.header[POSTED]) == step

    def add_posted_into(self, params: dict[str, torch.Tensor]) -> None:
        """Add the posted gradient to `params`' .grad (name -> parameter)."""
        with torch.no_grad():
            for name, buf in self.grads.items():
                p = params[name]
                if p.grad is None:
                    p.grad = buf.clone()
                else:
                    p.grad.add_(buf)

    # ------------------------------------------------------------------------------------------------ generator
    def steal(self, known: Any) -> tuple[int, int] | None:
        """(step, job) of the last open job, taken for the generator while the step is not closed and (step, job) is
        in `known` (the generator has its description); None otherwise."""
        with self._lock:
            if int(self.header[CLOSED]):
                return None
            n = int(self.header[JOBS])
            open_jobs = (self.state[:n] == OPEN).nonzero().flatten().tolist()
            step = int(self.header[STEP])
            if not open_jobs or (step, open_jobs[-1]) not in known:
                return None
            j = open_jobs[-1]
            self.state[j] = GENERATOR
            return step, j

    def done(self, job: int) -> None:
        with self._lock:
            self.state[job] = GENERATOR_DONE

    def due(self) -> int | None:
        """The step whose generator gradient should be posted now: closed, the generator took some of its jobs and
        none is still running, and not posted yet. None otherwise."""
        with self._lock:
            step = int(self.header[STEP])
            if not int(self.header[CLOSED]) or int(self.header[POSTED]) == step:
                return None
            n = int(self.header[JOBS])
            states = self.state[:n]
            if bool((states == GENERATOR).any()) or not bool((states == GENERATOR_DONE).any()):
                return None
            return step

    def post(self, params: dict[str, torch.Tensor], step: int) -> None:
        """Copy `params`' .grad (zeros where None) into the buffers and mark `step` posted."""
        with self._lock, torch.no_grad():
            for name, buf in self.grads.items():
                g = params[name].grad
                if g is None:
                    buf.zero_()
                else:
                    buf.copy_(g)
            self.header[POSTED] = step
