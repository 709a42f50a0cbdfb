"""The generator process's side of a shared update (`trainer.update_on_generator`; the protocol is in
update_jobs.py): `UpdateHelper` runs jobs of the trainer's step on the generator's decoding thread while its
engine has nothing to generate.

It keeps the trajectories of the groups it sent (the trainer trains those), the trainer's job descriptions (step,
job, the arrival's group numbers, the micro-batch's rows), and its own copy of the policy with gradients, loaded
from the pushed weights of the step it works on. An arrival's batch is rebuilt from the same trajectories in the
same order, so a job's rows mean what they mean in the trainer.
"""
from __future__ import annotations

import copy
import queue as queue_mod
import threading
import time
from typing import Any

from rlfactory.algorithms.grpo import actor_config
from rlfactory.trainer.streamed_update import UpdatePart, arrival, run_micro, step_correction
from rlfactory.trainer.update import GRPOUpdate
from rlfactory.trainer.weight_push import trainable_parameters


class UpdateHelper(GRPOUpdate):
    """`keep(index, trajectories)` for each group sent, from the event loop; `run_one()` from the engine's decoding
    thread when idle; `take_messages()` and `post_due()` from either."""

    def __init__(self, recipe: Any, model: Any, tokenizer: Any, device: Any, jobs: Any, weights: Any,
                 messages: Any, results: Any):
        r = self.recipe = recipe
        self.model = copy.deepcopy(model).eval()  # before the engine serves from `model`
        self.named = trainable_parameters(self.model)
        self.params = list(self.named.values())
        self.tokenizer, self.device = tokenizer, device
        self.ref_model = None  # a run with a KL reference does not share its update
        self.actor_cfg = actor_config(r.algorithm, samples_per_prompt=r.rollout.samples_per_prompt,
                                      mini_batch_prompts=r.trainer.prompts_per_step)
        self.correction = step_correction(r.algorithm.off_policy)
        self.jobs, self.weights, self.messages, self.results = jobs, weights, messages, results
        self.version = -1  # the pushed version loaded into self.model
        self.groups: dict[int, list[Any]] = {}
        self.descriptions: dict[tuple[int, int], tuple[tuple[int, ...], list[int]]] = {}
        self.arrivals: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.part: UpdatePart | None = None
        self.seconds = 0.0
        """Cumulative seconds of jobs run here (the generator's stats)."""
        self._post_lock = threading.Lock()
        self._lock = threading.Lock()  # groups and descriptions: the event loop writes them, the decoding thread reads

    # ------------------------------------------------------------------------------------------- event loop
    def keep(self, index: int, trajectories: list[Any]) -> None:
        with self._lock:
            self.groups[index] = trajectories

    def take_messages(self) -> None:
        """Read the trainer's messages: ("open", step, watermark) forgets groups below the watermark and older
        steps' descriptions; ("job", step, job, group_indices, rows) describes a job."""
        while True:
            try:
                msg = self.messages.get_nowait()
            except queue_mod.Empty:
                return
            with self._lock:
                if msg[0] == "open":
                    _, step, watermark = msg
                    for i in [i for i in self.groups if i < watermark]:
                        del self.groups[i]
                    for key in [key for key in self.descriptions if key[0] < step]:
                        del self.descriptions[key]
                elif msg[0] == "job":
                    _, step, job, group_indices, rows = msg
                    if all(i in self.groups for i in group_indices):
                        self.descriptions[(step, job)] = (tuple(group_indices), list(rows))

    def forget(self, index: int) -> None:
        """A group dropped here never reaches the trainer."""
        with self._lock:
            self.groups.pop(index, None)

    # ------------------------------------------------------------------------------------------- decoding thread
    def run_one(self) -> bool:
        """Steal and run one job of the trainer's step; False when there was none to take."""
        self.take_messages()  # descriptions sent since the event loop last looked
        if self.weights.version != self.version:
            loaded = self.weights.load_into(self.model, self.version)
            if loaded is not None:
                self.version = loaded
        with self._lock:
            got = self.jobs.steal(_ForVersion(self.descriptions, self.version))
            if got is not None:
                step, job = got
                group_indices, rows = self.descriptions.pop((step, job))
                trajs = [t for i in group_indices for t in self.groups[i]]
        if got is None:
            self.post_due()
            return False
        t0 = time.perf_counter()
        if self.part is None or self.part.step != step:
            self.part = UpdatePart(step)
            self.arrivals = {}
            for p in self.params:
                p.grad = None
        arr = self.arrivals.get((step, group_indices))
        if arr is None:
            arr = self.arrivals[(step, group_indices)] = arrival(self, trajs, self.recipe.algorithm.micro_batch_size)
        run_micro(self, arr, rows, self.correction, self.part.totals, self.part.acc)
        seconds = time.perf_counter() - t0
        self.part.jobs += 1
        self.part.rows += len(rows)
        self.part.seconds += seconds
        self.seconds += seconds
        self.jobs.done(job)
        self.post_due()
        return True

    def post_due(self) -> None:
        """Once the trainer closed the step and no job of it runs here: post the jobs' gradient, then send their
        metrics (the trainer, waiting for both, finds the gradient posted when the message comes)."""
        with self._post_lock:
            step = self.jobs.due()
            if step is None or self.part is None or self.part.step != step:
                return
            self.jobs.post(self.named, step)
            self.results.put(("update_part", self.part))
            self.part = None
            for p in self.params:
                p.grad = None


class _ForVersion:
    """The described jobs `steal` may take: those of the step whose weights are loaded here."""

    def __init__(self, descriptions: dict[tuple[int, int], Any], version: int):
        self.descriptions, self.version = descriptions, version

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key[0] == self.version and key in self.descriptions
