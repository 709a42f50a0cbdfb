"""The generator's idle core takes jobs of the trainer's update (`trainer.update_on_generator`): an optional part of
an asynchronous run on CPU with the cores split. Nothing in the core imports this module: `rlfactory.api.train` names
`generator_side` in the generator's spec (`HELPER`: a `helper.GeneratorHelper`, imported there by name) and hands
`SharedUpdate` to the asynchronous loop (a `loop.StepShare`). Both sides ask `applies(recipe)`; their traffic is the
channels' helper queue and lock.

On 2 cores the trainer's update is what an asynchronous run waits for, while the generator's decoding core idles once
it has generated everything the staleness bound allows. So a streamed step (streamed.py) offers the last rows of each
arrival (its longest) as small jobs at the end of its queue:

    trainer (SharedUpdate)                              generator (GeneratorSide, a thread on the decoding CPUs)
    ----------------------                              ---------------------------------------------------------
    open_step(step) (after publishing its weights)
    describe job j on the jobs queue, open it   ---->   knows the job (it holds the groups' trajectories)
    claim(j) in order, run it                           while the generator has nothing in flight: steal the LAST
                                                        open job, run it on its copy of the step's pushed weights
    close_step() once every group is in           <---  post(): its jobs' summed gradient (shared memory), then
    wait, collect(): add the gradient                    ("update_part", UpdatePart) with their sums and seconds

Each job is claimed once, under one lock, so every micro-batch is computed exactly once, by one side; losses are sums
(normaliser 1, streamed.py) and the trainer divides the total, so the gradient is the step's own, up to float
rounding in the order of additions. The generator steals from the end while the trainer works from the front.
The job table and the gradient buffers are update_jobs.py's `UpdateJobs`.
Left out: GPUs (the trainer's device is the GPU: nothing to lend), a KL reference (the generator holds none).
"""
from __future__ import annotations

import copy
import os
import queue as queue_mod
import threading
import time
from typing import Any

from rlfactory.algorithms.grpo import actor_config
from rlfactory.algorithms.off_policy import CorrectionTotals
from rlfactory.models.devices import resolve_device
from rlfactory.recipe.schema import Recipe
from rlfactory.recipe.training import OffPolicyConfig
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.trainer.asynchronous.channels import Channels
from rlfactory.trainer.asynchronous.launch import GeneratorLaunch
from rlfactory.trainer.asynchronous.messages import HelperSpec
from rlfactory.trainer.asynchronous.streamed import streams
from rlfactory.trainer.asynchronous.update_jobs import UpdateJobs, UpdatePart
from rlfactory.trainer.asynchronous.weights import SharedWeights, trainable_parameters
from rlfactory.trainer.policy import Policy
from rlfactory.trainer.run import TrainingRun
from rlfactory.trainer.update import Correction, MicroTotals, Prepared, Update

JOB_ROWS, TAIL_JOBS = 8, 2
"""Each arrival's last TAIL_JOBS x JOB_ROWS rows (its longest) become jobs of JOB_ROWS rows; the rest are cut into
micro-batches as usual: the generator, idle late in the step, takes small jobs from the end, so the side finishing
last waits little for the other, while the trainer's first micro-batches stay large (each has a fixed cost)."""
IDLE_POLL_S = 0.002
"""How often the generator's side looks for a job while it may work and finds none."""


HELPER = HelperSpec(factory=f"{__name__}:generator_side")
"""The generator's side, as its spec names it (`rlfactory.api.SHARED_UPDATE_HELPER` spells it out)."""


def applies(recipe: Recipe) -> bool:
    """Whether the recipe asks for the shared update and its runs can have it: CPU with the cores split, the HF
    engine (whose decoding CPUs the jobs take), streamed steps, no KL reference."""
    t, kl = recipe.trainer, recipe.algorithm.kl
    return (t.update_on_generator and t.split_cores and resolve_device(t.device).type == "cpu"
            and recipe.rollout.engine == "hf" and streams(recipe) and not (kl.use_reference and kl.coef > 0))


# ---------------------------------------------------------------------------------------------------- the trainer
class SharedUpdate:
    """The trainer's side: a `loop.StepShare` (and `streamed.JobShare`)."""

    def __init__(self) -> None:
        self.messages: Any = None
        """To the generator: ("jobs", UpdateJobs) once, ("open", step, watermark), ("job", step, job, groups, rows)."""
        self.jobs: UpdateJobs | None = None
        self._model: Any = None
        self.step = -1
        self.next_job = 0
        self.parts: dict[int, UpdatePart] = {}

    def attach(self, run: TrainingRun, launch: GeneratorLaunch) -> bool:
        if launch.engine_cpus is None or not applies(run.recipe):  # no core of the generator's to lend
            return False
        self.messages, self._model = launch.channels.helper_messages, run.policy.model
        self.jobs = UpdateJobs.from_model(run.policy.model, launch.channels.helper_lock)
        self.messages.put(("jobs", self.jobs))
        return True

    def open_step(self, step: int, watermark: int) -> None:
        self.step, self.next_job = step, 0
        self.jobs.open(step)
        self.messages.put(("open", step, watermark))

    def plan(self, update: Update, prep: Prepared, micro: list[list[int]],
             group_indices: list[int]) -> list[tuple[list[int], int | None]]:
        ordered = [i for m in micro for i in m]  # shortest to longest
        n_tail = min(len(ordered), TAIL_JOBS * JOB_ROWS)
        head, tail = ordered[:len(ordered) - n_tail], ordered[len(ordered) - n_tail:]
        planned: list[tuple[list[int], int | None]] = [(rows, None) for rows in update.micro_batches(prep, head)]
        for i in range(0, n_tail, JOB_ROWS):
            rows = sorted(tail[i:i + JOB_ROWS])
            job = self.next_job
            self.messages.put(("job", self.step, job, tuple(group_indices), rows))
            if self.jobs.add_job(job):
                self.next_job += 1
                planned.append((rows, job))
            else:
                planned.append((rows, None))
        return planned

    def claim(self, job: int) -> bool:
        return self.jobs.claim(job)

    def close_step(self) -> bool:
        return self.jobs.close() > 0

    def take_message(self, kind: str, body: Any) -> bool:
        if kind != "update_part":
            return False
        self.parts[body.step] = body
        return True

    def ready(self, step: int) -> bool:
        return self.jobs.posted(step) and step in self.parts

    def collect(self, step: int) -> tuple[MicroTotals | None, CorrectionTotals | None, dict[str, float]]:
        part = self.parts.pop(step, None)
        if part is None:
            return None, None, {"async/generator_update_jobs": 0.0, "async/generator_update_rows": 0.0,
                                "async/generator_update_s": 0.0}
        self.jobs.add_posted_into(trainable_parameters(self._model))
        return part.acc, part.totals, {"async/generator_update_jobs": float(part.jobs),
                                       "async/generator_update_rows": float(part.rows),
                                       "async/generator_update_s": part.seconds}

    def close(self) -> None:
        """Nothing to release: the channels are the launch's."""


# ---------------------------------------------------------------------------------------------------- the generator
def generator_side(channels: Channels, recipe: Recipe, model: Any, tokenizer: Any, device: Any,
                   weights: SharedWeights, cpus: list[int] | None) -> GeneratorSide | None:
    """The generator's factory (`HELPER`): a GeneratorSide where the run can share its update, else None."""
    if not cpus or not applies(recipe):
        return None
    side = GeneratorSide(channels, recipe, model, tokenizer, device, weights, cpus)
    side.start()
    return side


class GeneratorSide:
    """The generator process's side (a `helper.GeneratorHelper`): jobs of the trainer's step, run on a thread of
    its own pinned to the decoding CPUs, on its own copy of the policy loaded with the step's pushed weights, while
    the generator has nothing in flight. It keeps the trajectories of the groups it sent, so an arrival's batch is
    rebuilt from the same trajectories in the same order and a job's rows mean what they mean in the trainer."""

    def __init__(self, channels: Channels, recipe: Recipe, model: Any, tokenizer: Any, device: Any,
                 weights: SharedWeights, cpus: list[int] | None):
        self.lock, self.messages = channels.helper_lock, channels.helper_messages
        self.results, self.weights, self.cpus = channels.results, weights, cpus
        copy_ = copy.deepcopy(model).eval()  # before the engine serves from `model`
        self.named = trainable_parameters(copy_)
        a = recipe.algorithm
        policy = Policy(recipe, copy_, tokenizer, device, list(self.named.values()), optimizer=None, scheduler=None,
                        reference=None, actor_cfg=actor_config(a, samples_per_prompt=recipe.rollout.samples_per_prompt,
                                                               mini_batch_prompts=recipe.trainer.prompts_per_step))
        self.update = Update(policy)
        off: OffPolicyConfig | None = a.off_policy if a.off_policy.is_cap is not None else None
        self.off_policy = off
        self.jobs: UpdateJobs | None = None
        self.version = -1  # the pushed version loaded into the copy
        self.groups: dict[int, list[Trajectory]] = {}
        self.descriptions: dict[tuple[int, int], tuple[tuple[int, ...], list[int]]] = {}
        self.prepared: dict[tuple[int, tuple[int, ...]], Prepared] = {}
        self.part: UpdatePart | None = None
        self._seconds = 0.0
        self._lock = threading.Lock()  # groups and descriptions: the event loop writes them, the thread reads
        self._may_work = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shared-update", daemon=True)

    def start(self) -> None:
        """Start the thread that takes jobs (while the generator says it is idle)."""
        self._thread.start()

    # ------------------------------------------------------------------------------------------- the event loop
    @property
    def seconds(self) -> float:
        return self._seconds

    def keep(self, index: int, trajectories: list[Trajectory]) -> None:
        with self._lock:
            self.groups[index] = trajectories

    def forget(self, index: int) -> None:
        with self._lock:
            self.groups.pop(index, None)

    def idle(self, idle: bool) -> None:
        if idle:
            self._may_work.set()
        else:
            self._may_work.clear()

    def close(self) -> None:
        self._stop.set()
        self._may_work.set()
        if self._thread.is_alive():
            self._thread.join(30)

    # ------------------------------------------------------------------------------------------- its thread
    def _run(self) -> None:
        if self.cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, self.cpus)  # Linux: this thread only
            except OSError:
                pass
        while not self._stop.is_set():
            self._take_messages()
            self._post_due()
            if not self._may_work.wait(0.05) or self._stop.is_set():
                continue
            if not self._run_one():
                time.sleep(IDLE_POLL_S)

    def _take_messages(self) -> None:
        while True:
            try:
                msg = self.messages.get_nowait()
            except queue_mod.Empty:
                return
            with self._lock:
                if msg[0] == "jobs":
                    self.jobs = msg[1].with_lock(self.lock)
                elif msg[0] == "open":
                    _, step, watermark = msg
                    for i in [i for i in self.groups if i < watermark]:
                        del self.groups[i]
                    for key in [key for key in self.descriptions if key[0] < step]:
                        del self.descriptions[key]
                elif msg[0] == "job":
                    _, step, job, group_indices, rows = msg
                    if all(i in self.groups for i in group_indices):
                        self.descriptions[(step, job)] = (tuple(group_indices), list(rows))

    def _run_one(self) -> bool:
        """Steal and run one job of the trainer's step; False when there was none to take."""
        if self.jobs is None:
            return False
        if self.weights.version != self.version:
            loaded = self.weights.load_into(self.update.policy.model, self.version)
            if loaded is not None:
                self.version = loaded
        with self._lock:
            known = {key for key in self.descriptions if key[0] == self.version}
            got = self.jobs.steal(known)
            if got is None:
                return False
            step, job = got
            group_indices, rows = self.descriptions.pop((step, job))
            trajs = [t for i in group_indices for t in self.groups[i]]
        t0 = time.perf_counter()
        if self.part is None or self.part.step != step:
            self.part = UpdatePart(step)
            self.prepared = {}
            for p in self.update.policy.params:
                p.grad = None
        prep = self.prepared.get((step, group_indices))
        if prep is None:
            prep = self.prepared[(step, group_indices)] = self.update.prepare(trajs)
        self.update.normalise_by(None)
        correction = Correction(self.off_policy, totals=self.part.totals)
        self.update.backward(prep, rows, correction, self.part.acc)
        seconds = time.perf_counter() - t0
        self.part.jobs += 1
        self.part.rows += len(rows)
        self.part.seconds += seconds
        self._seconds += seconds
        self.jobs.done(job)
        self._post_due()
        return True

    def _post_due(self) -> None:
        """Once the trainer closed the step and no job of it runs here: post the jobs' gradient, then send their
        sums (the trainer, waiting for both, finds the gradient posted when the message comes)."""
        if self.jobs is None or self.part is None:
            return
        step = self.jobs.due()
        if step is None or self.part.step != step:
            return
        self.jobs.post(self.named, step)
        self.results.put(("update_part", self.part))
        self.part = None
        for p in self.update.policy.params:
            p.grad = None
