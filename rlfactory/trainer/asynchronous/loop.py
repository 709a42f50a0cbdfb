"""The local engine, asynchronous (`trainer.max_staleness_steps: k >= 1`): a generator process keeps rolling out
while this process updates the policy.

    generator process (generator.py): rollouts + rewards with the newest pushed weights, as the staleness rule admits
    this process (`AsyncSteps`): take prompts_per_step finished groups (staleness.py) -> GRPO update with an
        off-policy correction -> publish the weights (weights.py): the generator
        picks them up within its poll

`AsyncSteps` runs one step; the run around it is the scaffold both loops share (run.py). With one mini-batch and one
epoch per step and no masking (the defaults), the update is built as the groups arrive (streamed.py): the
forward/backward of the groups already here runs while the generator finishes the rest, and once the last is in
only its own pass and the optimizer step remain. Otherwise the step waits for every group (`Update.whole_batch`).
A `StepShare` (optional, given by the caller: the generator's idle core taking jobs of the update,
shared_update.py) takes part of a streamed step's micro-batches; the step then waits for its gradient.
The loss is the decoupled PPO objective with truncated importance weights and/or masking (`algorithm.off_policy`,
algorithms/off_policy.py). A step whose every trajectory failed for infrastructure reasons is skipped as in the
synchronous loop (outage.py): no update and no push, and its groups free their places under the bound once the
outage pause is over. While a step waits on the generator, a watchdog (watch.py) logs what it waits for, and stops
the run when the generator stalls.

Metrics per step add `async/*`: staleness per token and per trajectory (mean, max), trajectories dropped, weight-push
seconds (trainer) and weight-load seconds (generator), idle seconds of the trainer (waiting for groups) and of the
generator's engine (no forward pass to run), seconds the bound held the generator back; and `off_policy/*`:
behaviour-vs-proximal logprob gap and KL, tokens clipped or masked by the correction.

Checkpoints hold the model, optimizer and the data position: the first group not yet trained, and those trained
after it. Groups in flight or waiting when a run is killed are discarded, and a resumed run generates their prompts
again under the restored weights (so a resume is exact only for k = 0, the synchronous loop).
Left out: more than one generator process.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import torch

from rlfactory.errors import RLFactoryError
from rlfactory.recipe.schema import Recipe
from rlfactory.report.step_row import step_row
from rlfactory.reward import combine_reward_metrics
from rlfactory.rollout.engines.protocol import ENGINE_COUNTERS
from rlfactory.rollout.horizon import stage_for_step
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.rollout_side import RolloutSide, open_rollout_side
from rlfactory.tools.counters import combine_counters
from rlfactory.trainer.asynchronous.groups import GroupQueue
from rlfactory.trainer.asynchronous.launch import GeneratorLaunch
from rlfactory.trainer.asynchronous.messages import Failure, GroupDropped, GroupResult, Message, Ready, Setup
from rlfactory.trainer.asynchronous.staleness import Staleness
from rlfactory.trainer.asynchronous.streamed import JobShare, StreamedStep, streams
from rlfactory.trainer.asynchronous.watch import GeneratorStalled, GeneratorWatch
from rlfactory.trainer.asynchronous.weights import SharedWeights
from rlfactory.trainer.outage import Verdict
from rlfactory.trainer.run import StageTimer, StepOutcome, TrainingRun
from rlfactory.trainer.update import MicroTotals

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0
"""How long the generator may take to load the model and start its tool servers (and its engine)."""


class StepShare(JobShare, Protocol):
    """Part of a streamed step's micro-batches run elsewhere (a `JobShare`), and the step's side of it."""

    def attach(self, run: TrainingRun, launch: GeneratorLaunch) -> bool:
        """Once the model is loaded and the generator spawned: whether the share takes part in this run."""
        ...

    def open_step(self, step: int, watermark: int) -> None:
        """A streamed step at policy version `step` begins (its weights are published)."""
        ...

    def close_step(self) -> bool:
        """No more jobs are taken; whether the other worker took some (wait until `ready`)."""
        ...

    def take_message(self, kind: str, body: Any) -> bool:
        """A message from the generator of a kind the loop does not know: whether it was the share's."""
        ...

    def ready(self, step: int) -> bool:
        """The other worker's gradient and sums of `step` have arrived."""
        ...

    def collect(self, step: int) -> tuple[MicroTotals | None, Any, dict[str, float]]:
        """Add the other worker's gradient of `step` into the parameters (if it took jobs); its sums (`MicroTotals`,
        the correction's totals; None when it took none) and the metrics of its part."""
        ...

    def close(self) -> None:
        """The run is over."""
        ...


class AsyncSteps:
    """The asynchronous loop's steps (a `run.StepSource`), fed by a generator process."""

    def __init__(self, run: TrainingRun, launch: GeneratorLaunch | None = None, share: StepShare | None = None):
        self.run = run
        self.launch = launch  # started before this process loaded torch (api.train), or in `open`
        self.share = share
        self._sharing = False
        r = run.recipe
        self.queue = GroupQueue()
        self.staleness: Staleness | None = None  # the launch's shared counter is needed: made in `open`
        self.streamed = streams(r)
        self.watch: GeneratorWatch | None = None
        self.weights: SharedWeights | None = None
        self._gen_stats: dict[str, float] = {}
        self._prev_stats: dict[str, float] = {}
        self._eval_stack = contextlib.AsyncExitStack()
        self._eval_side: RolloutSide | None = None

    # ----------------------------------------------------------------------------------------------- the run
    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        run, t = self.run, self.run.recipe.trainer
        if self.launch is None:
            self.launch = GeneratorLaunch.start(run.recipe)
        self.staleness = Staleness(run.recipe.trainer, self.launch.channels.released)
        self.watch = GeneratorWatch(self.launch.proc.pid, t.generator_watchdog_s, t.generator_stall_timeout_s)
        self.weights = SharedWeights.from_model(run.policy.model, self.launch.channels.weights_lock,
                                                version=run.step)
        self._sharing = self.streamed and self.share is not None and self.share.attach(run, self.launch)
        self.launch.setup(Setup(weights=self.weights, start_index=self.queue.watermark,
                                skip=sorted(self.queue.done_above), start_version=run.step,
                                engine_cpus=self.launch.engine_cpus))
        try:
            async with self._eval_stack:
                await self._wait_ready()
                self._prev_stats = dict(self._gen_stats)
                yield
        finally:
            self.launch.channels.stop.set()  # it closes its tool servers and exits while the summary is written

    async def step(self, index: int, timer: StageTimer) -> StepOutcome:
        run, r = self.run, self.run.recipe
        self.watch.begin()
        self.staleness.begin_step()
        if self.streamed:
            groups, verdict, upd_m = await self._streamed_step(index, timer)
        else:
            with timer("wait"):
                while not (groups := self.staleness.take(self.queue, index, r.trainer.prompts_per_step,
                                                         whole=True)):
                    await self._receive(0.05, f"the {r.trainer.prompts_per_step} groups of step {index + 1}")
            verdict = run.outage.judge(_trajectories(groups), index + 1)
            if verdict is Verdict.TRAIN:
                with timer("update"):
                    upd_m = await asyncio.to_thread(run.update.whole_batch, _trajectories(groups),
                                                    r.algorithm.off_policy)
        trajs = _trajectories(groups)
        if verdict is not Verdict.TRAIN:
            return StepOutcome(verdict, trajs, groups=len(groups))
        with timer("push"):
            self.weights.publish(run.policy.model, index + 1)
        counts = [g.tools for g in groups if g.tools is not None]
        tools = None
        if counts:
            tools = combine_counters(counts)
            tools["restarts"] = int(self._gen_stats.get("tool_restarts", 0.0) - self._prev_stats.get("tool_restarts",
                                                                                                      0.0))
        row = step_row(index + 1, trajectories=trajs,
                       reward=combine_reward_metrics([m for g in groups for m in g.reward_metrics]),
                       horizon=max(x.horizon or 0 for x in trajs),
                       horizon_stage=stage_for_step(r.rollout.horizon, index), tools=tools,
                       parts=[upd_m, self.staleness.metrics(self.queue, trajs, index),
                              self._async_metrics(index, timer)])
        self._prev_stats = dict(self._gen_stats)
        return StepOutcome(verdict, trajs, row, groups=len(groups))

    async def after_skip(self, outcome: StepOutcome) -> None:
        # their places under the bound are free again once the pause is over: the groups that take them start when
        # the servers may be back, not at once into the same outage
        self.staleness.release(outcome.groups)

    async def evaluation_side(self) -> RolloutSide:
        """A rollout side in this process, on the trainer's own model (opened at the first eval, kept to the end)."""
        if self._eval_side is None:
            pol = self.run.policy
            self._eval_side = await self._eval_stack.enter_async_context(
                open_rollout_side(self.run.recipe, pol.model, pol.tokenizer, pol.device, self.run.out / "eval"))
        return self._eval_side

    def checkpoint_state(self) -> dict[str, Any]:
        self.run.sampler.seek(self.queue.watermark)
        return {"async": self.queue.state()}

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if state.get("async") is None:  # a synchronous run's checkpoint: it drew prompts_per_step groups per step
            self.queue.watermark = self.run.sampler.absolute_position()
        else:
            self.queue.load_state(state["async"])

    def summary(self) -> dict[str, Any]:
        return {"max_staleness_steps": self.run.recipe.trainer.max_staleness_steps,
                "dropped_trajectories": self.queue.dropped_trajectories}

    # ----------------------------------------------------------------------------------------------- a step
    async def _streamed_step(self, index: int, timer: StageTimer) -> tuple[list[GroupResult], Verdict,
                                                                          dict[str, float]]:
        """The step's groups, the outage guard's verdict on them, and the update's metrics (none unless TRAIN: no
        optimizer step), the update built as the groups arrive (streamed.py)."""
        run = self.run
        need = run.recipe.trainer.prompts_per_step
        share = self.share if self._sharing else None
        if share is not None:
            share.open_step(index, self.queue.watermark)
        step = StreamedStep(run.update, run.recipe.algorithm.off_policy, share)
        groups: list[GroupResult] = []
        other, other_totals, share_m = None, None, {}
        try:
            while len(groups) < need or step.pending():
                await self._receive(0.0)  # whatever arrived during the last micro-batch
                got = self.staleness.take(self.queue, index, need - len(groups)) if len(groups) < need else []
                if got:
                    groups += got
                    with timer("update"):
                        await asyncio.to_thread(step.plan, _trajectories(got), [g.index for g in got])
                    continue
                if step.pending():
                    with timer("update"):
                        await asyncio.to_thread(step.run_next)
                    continue
                with timer("wait"):
                    await self._receive(0.05, f"the groups of step {index + 1} ({len(groups)} of {need} here)")
            if share is not None:
                if share.close_step():
                    with timer("wait_jobs"):  # the jobs the other worker took
                        while not share.ready(index):
                            await self._receive(0.01, f"the update jobs of step {index + 1} it took")
                other, other_totals, share_m = share.collect(index)
            verdict = run.outage.judge(_trajectories(groups), index + 1)
            if verdict is not Verdict.TRAIN:
                step.abort()
                return groups, verdict, {}
            with timer("update"):
                metrics = await asyncio.to_thread(step.finish, other, other_totals)
        except BaseException:
            step.abort()
            raise
        return groups, verdict, {**metrics, **share_m}

    # ----------------------------------------------------------------------------------------------- the generator
    def _take(self, msg: Message) -> None:
        kind, body = msg
        self.watch.heard(kind, body)
        if isinstance(body, Failure):
            if body.user:
                raise RLFactoryError(f"the generator process failed: {body.message}")
            raise RLFactoryError(f"the generator process failed: {body.message}\n{body.traceback}")
        if isinstance(body, GroupResult):
            self.queue.add(body)
            self._gen_stats = body.stats
        elif isinstance(body, GroupDropped):
            self.staleness.dropped_by_generator(self.queue, body.index, body.trajectories)
            self._gen_stats = body.stats
        elif self.share is not None:
            self.share.take_message(kind, body)

    async def _receive(self, timeout_s: float, waiting_for: str | None = None) -> None:
        """Take what the generator sent within `timeout_s`. `waiting_for` (words): the step is waiting for it, and
        the watchdog logs at intervals and raises GeneratorStalled past its bound."""
        launch = self.launch
        for msg in await asyncio.to_thread(launch.channels.drain, timeout_s):
            self._take(msg)
        if not launch.proc.is_alive() and launch.channels.results.empty():
            raise RLFactoryError(f"the generator process exited (code {launch.proc.exitcode}) without reporting an "
                                 f"error; see the log above")
        if waiting_for is not None:
            try:
                self.watch.check(waiting_for)
            except GeneratorStalled:
                # a stopped process ignores the stop flag and SIGTERM: resumed, it closes its tool servers and exits
                with contextlib.suppress(OSError):
                    os.kill(launch.proc.pid, signal.SIGCONT)
                raise

    async def _wait_ready(self) -> None:
        proc = self.launch.proc
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            for kind, body in await asyncio.to_thread(self.launch.channels.drain, 0.2):
                if isinstance(body, Ready):
                    logger.info("generator process %s ready (policy version %s)", body.pid, body.version)
                    return
                self._take((kind, body))
            if not proc.is_alive():
                raise RLFactoryError(f"the generator process exited (code {proc.exitcode}) while starting")
            if time.monotonic() > deadline:
                raise RLFactoryError(f"the generator process did not start within {READY_TIMEOUT_S:.0f} s")

    def _async_metrics(self, index: int, timer: StageTimer) -> dict[str, float]:
        now, prev = self._gen_stats, self._prev_stats

        def delta(key: str) -> float:
            return float(now.get(key, 0.0) - prev.get(key, 0.0))

        wait_groups, wait_jobs = timer.seconds.get("wait", 0.0), timer.seconds.get("wait_jobs", 0.0)
        return {
            "async/policy_version": float(index),
            "async/weight_push_s": timer.seconds.get("push", 0.0),
            "async/weight_load_s": delta("weight_load_s"),
            "async/weight_loads": delta("weight_loads"),
            "async/trainer_idle_s": wait_groups + wait_jobs,
            "async/trainer_wait_groups_s": wait_groups,
            "async/trainer_wait_jobs_s": wait_jobs,
            "async/generator_idle_s": max(0.0, delta("wall_s") - delta("engine_busy_s") - delta("update_s")),
            "async/generator_gated_s": delta("gated_s"),
            **{f"async/{k}": delta(k) for k in ENGINE_COUNTERS.values()},
        }


def _trajectories(groups: list[GroupResult]) -> list[Trajectory]:
    return [x for g in groups for x in g.trajectories]


def train_async(recipe: Recipe, *, resume: bool = False, progress: bool = False,
                launch: GeneratorLaunch | None = None, share: StepShare | None = None) -> dict[str, Any]:
    """Run an asynchronous local recipe; returns the summary dict. `launch`: a generator already started for this
    recipe (it is stopped when the run ends, however it ends); `share`: optional work it takes of the update (its
    generator side must be in the launch's spec)."""
    torch.set_num_threads(recipe.trainer.torch_threads)
    steps = None
    try:
        run = TrainingRun(recipe, resume=resume, progress=progress)
        steps = AsyncSteps(run, launch, share)
        return asyncio.run(run.run(steps))
    finally:
        launch = steps.launch if steps is not None else launch
        if launch is not None:
            launch.stop()
        if share is not None:
            share.close()
