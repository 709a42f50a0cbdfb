"""The local engine, asynchronous (`trainer.max_staleness_steps: k >= 1`): a generator process keeps rolling out
while this process updates the policy, on separate cores.

    generator process (generator.py): rollouts + rewards with the newest pushed weights, up to the staleness bound
    this process: take prompts_per_step finished groups -> GRPO update with off-policy correction -> push weights

With one mini-batch and one epoch per step and no masking (the defaults), the update is built as the groups arrive
(streamed_update.py): forward/backward of the groups already here runs while the generator finishes the rest, and
once the last is in only its own pass and the optimizer step remain. Otherwise the step waits for every group.
On CPU with the cores split (`trainer.update_on_generator`), the step's micro-batches are jobs that the generator's
decoding thread takes from the end of the queue once it has nothing to generate (update_jobs.py).

Step s trains policy version s (s optimizer steps taken) on groups whose tokens were sampled by versions s-k..s.
`trainer.stale_groups` says what happens to a group that falls behind the bound: `drop` (default) takes finished
groups oldest first and drops (counts) any whose oldest token is more than k versions old; `wait` takes groups in
the order they started, so none is ever too old, and a straggler holds the step. The loss is the decoupled PPO
objective with truncated importance weights and/or masking (`algorithm.off_policy`, algorithms/off_policy.py).

Metrics per step (metrics.jsonl) add `async/*`: staleness per token and per trajectory (mean, max), trajectories
dropped, weight-push seconds (trainer) and weight-load seconds (generator), idle seconds of the trainer (waiting for
groups, or for the generator's jobs) and of the generator's engine (no forward pass to run, nor update job), seconds
the bound held the generator back, the update jobs, rows and seconds the generator took; and
`off_policy/*`: behaviour-vs-proximal logprob gap and KL, tokens clipped or masked by the correction.

A step whose every trajectory failed for infrastructure reasons is skipped as in the synchronous loop (outage.py):
no update and no push, and its groups free their places under the bound. While a step waits on the generator, a
watchdog (generator_watch.py) logs at intervals what it waits for, and stops the run when the generator stalls.

Checkpoints hold the model, optimizer and the data position: the first group not yet trained, and those trained
after it. Groups in flight or waiting when a run is killed are discarded, and a resumed run generates their
prompts again under the restored weights (so a resume is exact only for k = 0, the synchronous loop).
Left out: more than one generator process, vLLM as the generator.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any

import torch

from rlfactory.algorithms.off_policy import staleness_metrics
from rlfactory.errors import RLFactoryError
from rlfactory.report.metrics import MetricsLog
from rlfactory.reward import combine_reward_metrics
from rlfactory.rollout.agent_loop import rollout_metrics
from rlfactory.rollout.engines.protocol import ENGINE_COUNTERS
from rlfactory.rollout.horizon import stage_for_step
from rlfactory.tools.counters import combine_counters, tool_metrics
from rlfactory.trainer.generator_launch import GeneratorLaunch, Setup, drain
from rlfactory.trainer.generator_watch import GeneratorStalled, GeneratorWatch
from rlfactory.trainer.group_queue import GroupQueue
from rlfactory.trainer.heap import FrozenHeap
from rlfactory.trainer.loop import LocalTrainer, StageTimer
from rlfactory.trainer.outage import Verdict
from rlfactory.trainer.progress import StepProgress
from rlfactory.trainer.streamed_update import StreamedStep, UpdatePart, streams
from rlfactory.trainer.update_jobs import UpdateJobs
from rlfactory.trainer.weight_push import SharedWeights, trainable_parameters
from rlfactory.trainer.wiring import open_rollout_side

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0
"""How long the generator may take to load the model and start its tool servers."""


class AsyncTrainer(LocalTrainer):
    """`LocalTrainer` whose rollouts come from a generator process; `await run()` trains."""

    def __init__(self, *args: Any, launch: GeneratorLaunch | None = None, **kwargs: Any):
        self.launch = launch  # started before this process loaded torch (api.train), or here
        super().__init__(*args, **kwargs)
        t = self.recipe.trainer
        self.k = t.max_staleness_steps
        self.queue = GroupQueue(t.prompts_per_step, self.k, t.stale_groups)
        self._dropped_step = 0
        self._gen_stats: dict[str, float] = {}
        self.update_jobs: UpdateJobs | None = None  # set in run() when the generator shares the update
        self._parts: dict[int, UpdatePart] = {}  # the generator's share of a step's update, by step
        self.watch: GeneratorWatch | None = None  # set in run(), once the generator's pid is known

    # ----------------------------------------------------------------------------------------------- state
    def _save(self) -> Any:
        self.sampler.seek(self.queue.watermark)
        return super()._save()

    def _extra_state(self) -> dict[str, Any]:
        return {"async": self.queue.state()}

    def _restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if state.get("async") is None:  # a synchronous run's checkpoint: it drew prompts_per_step groups per step
            self.queue.watermark = self.sampler.absolute_position()
        else:
            self.queue.load_state(state["async"])

    # ----------------------------------------------------------------------------------------------- intake
    def _take(self, msg: tuple[str, Any]) -> None:
        kind, body = msg
        if self.watch is not None:
            self.watch.heard(kind, body)
        if kind == "error":
            if body["user"]:
                raise RLFactoryError(f"the generator process failed: {body['message']}")
            raise RLFactoryError(f"the generator process failed: {body['message']}\n{body['traceback']}")
        if kind == "group":
            self.queue.add(body)
            self._gen_stats = body.stats
        elif kind == "update_part":
            self._parts[body.step] = body
        elif kind == "dropped":
            self.queue.drop(body.index, body.trajectories)
            self._dropped_step += body.trajectories
            self._gen_stats = body.stats

    async def _receive(self, timeout_s: float, waiting_for: str | None = None) -> None:
        """Take what the generator sent within `timeout_s`. `waiting_for` (words): the step is waiting for it, and
        the watchdog (generator_watch.py) logs at intervals and raises GeneratorStalled past its bound."""
        launch = self.launch
        for msg in await asyncio.to_thread(drain, launch.results, timeout_s):
            self._take(msg)
        if not launch.proc.is_alive() and launch.results.empty():
            raise RLFactoryError(f"the generator process exited (code {launch.proc.exitcode}) without reporting an "
                                 f"error; see the log above")
        if waiting_for is not None and self.watch is not None:
            try:
                self.watch.check(waiting_for)
            except GeneratorStalled:
                # a stopped process ignores the stop flag and SIGTERM: resumed, it closes its tool servers and exits
                with contextlib.suppress(OSError):
                    os.kill(launch.proc.pid, signal.SIGCONT)
                raise

    def _pick(self, step: int, most: int | None = None) -> list[Any] | None:
        """prompts_per_step groups for the step at policy version `step`, or None while too few are ready; with
        `most`, up to that many of those ready now (maybe none)."""
        before = self.queue.dropped_trajectories
        if most is None:
            groups, dropped = self.queue.take(step)
        else:
            groups, dropped = self.queue.take_ready(step, most)
        if dropped:
            self._dropped_step += self.queue.dropped_trajectories - before
            with self.launch.trainer_drops.get_lock():
                self.launch.trainer_drops.value += dropped
        return groups

    # ----------------------------------------------------------------------------------------------- run
    async def run(self) -> dict[str, Any]:
        r, t = self.recipe, self.recipe.trainer
        self._catch_sigterm()
        self._restore(self._prepare_run_dir())
        start_step = self.step
        log = MetricsLog.for_recipe(self.recipe, self.out, purge_step=start_step + 1)
        wall0 = time.perf_counter()
        last_eval: dict[str, float] = {}
        bar = StepProgress(self.progress, t.total_steps, start_step)
        if self.launch is None:
            self.launch = GeneratorLaunch.start(r)
        self.watch = GeneratorWatch(self.launch.proc.pid, t.generator_watchdog_s, t.generator_stall_timeout_s)
        weights = SharedWeights.from_model(self.model, self.launch.lock, version=self.step)
        if self._shares_update():
            self.update_jobs = UpdateJobs.from_model(self.model, self.launch.jobs_lock)
        self.launch.setup(Setup(weights=weights, start_index=self.queue.watermark,
                                skip=sorted(self.queue.done_above), start_version=self.step,
                                engine_cpus=self.launch.engine_cpus, update_jobs=self.update_jobs))
        heap = FrozenHeap()
        heap.freeze()  # the imports and the model; again once the generator is ready
        try:
            async with contextlib.AsyncExitStack() as stack:
                await self._wait_ready()
                heap.freeze()
                streamed = streams(r)
                eval_side = None
                prev_stats = dict(self._gen_stats)
                while self.step < t.total_steps:
                    s = self.step
                    timer = StageTimer()
                    self._dropped_step = 0
                    self.watch.begin()
                    with timer("step"):
                        if streamed:
                            groups, verdict, upd_m = await self._streamed_step(s, timer)
                        else:
                            with timer("wait"):
                                while (groups := self._pick(s)) is None:
                                    await self._receive(0.05, f"the {t.prompts_per_step} groups of step {s + 1}")
                            verdict = self.outage.judge(_trajectories(groups), s + 1)
                            if verdict is Verdict.TRAIN:
                                with timer("update"):
                                    upd_m = await asyncio.to_thread(self._update, _trajectories(groups),
                                                                    r.algorithm.off_policy)
                        trajs = _trajectories(groups)
                        if verdict is Verdict.TRAIN:
                            self.step += 1
                            with timer("push"):
                                weights.publish(self.model, self.step)
                                self.launch.wake()
                    if verdict is not Verdict.TRAIN:
                        stop = await self._after_skipped_step(verdict)
                        # Their places under the bound are free again, once the pause is over: the groups that
                        # take them start when the servers may be back, not at once into the same outage.
                        with self.launch.trainer_drops.get_lock():
                            self.launch.trainer_drops.value += len(groups)
                        if stop:
                            break
                        continue
                    row: dict[str, Any] = {"step": self.step, "horizon": max(x.horizon or 0 for x in trajs),
                                           "horizon_stage": stage_for_step(r.rollout.horizon, s)}
                    rew_m = combine_reward_metrics([m for g in groups for m in g.reward_metrics])
                    self.rewards_so_far.append(rew_m["reward/mean"])
                    row.update(rew_m)
                    row.update(rollout_metrics(trajs))
                    counts = [g.tools for g in groups if g.tools is not None]
                    if counts:
                        tools_c = combine_counters(counts)
                        tools_c["restarts"] = int(self._gen_stats.get("tool_restarts", 0.0)
                                                  - prev_stats.get("tool_restarts", 0.0))
                        row.update(tool_metrics(tools_c))
                    row.update(upd_m)
                    row.update(timer.metrics())
                    row.update(staleness_metrics(trajs, s))
                    row.update(self._async_metrics(timer, prev_stats))
                    prev_stats = dict(self._gen_stats)
                    row["perf/tokens_per_s"] = sum(sum(x.loss_mask) for x in trajs) / max(timer.seconds["step"], 1e-9)
                    self._save_transcripts(trajs, s)
                    if t.eval_every_steps and (self.step % t.eval_every_steps == 0 or self.step == t.total_steps):
                        if eval_side is None:
                            eval_side = await stack.enter_async_context(
                                open_rollout_side(r, self.model, self.tokenizer, self.device, self.out / "eval"))
                        with timer("eval"):
                            last_eval = await self.evaluate(eval_side, tag=f"step_{self.step:06d}")
                        row.update({f"eval/{k}": v for k, v in last_eval.items() if isinstance(v, (int, float))})
                        row["perf/eval_s"] = timer.seconds["eval"]
                    self._end_step(row, log, bar, wall0)
                    if self._stop_after_step():
                        break
        finally:
            bar.close()
            log.close()
            heap.thaw()
            self.launch.stop_event.set()  # it closes its tool servers and exits while the summary is written
        summary = self._finish(start_step, wall0, last_eval, max_staleness_steps=self.k,
                               dropped_trajectories=self.queue.dropped_trajectories)
        self.launch.stop()
        return summary

    def _shares_update(self) -> bool:
        """Whether the generator takes jobs of the update (`trainer.update_on_generator`): on CPU with the cores
        split, for steps built as groups arrive, without a KL reference (the generator holds no reference model)."""
        return (self.recipe.trainer.update_on_generator and self.launch.engine_cpus is not None
                and self.device.type == "cpu" and streams(self.recipe) and self.ref_model is None)

    async def _streamed_step(self, s: int, timer: StageTimer) -> tuple[list[Any], Verdict, dict[str, float]]:
        """The step's groups, the outage guard's verdict on them, and the update's metrics (none unless TRAIN: no
        optimizer step), the update built as the groups arrive (streamed_update.py): forward/backward of each
        arrival's micro-batches runs while the generator finishes the rest, and when the update is shared, the
        generator's idle engine takes micro-batches from the end of the queue (update_jobs.py)."""
        need = self.recipe.trainer.prompts_per_step
        jobs = self.update_jobs
        describe = None
        if jobs is not None:
            jobs.open(s)
            messages = self.launch.job_messages
            messages.put(("open", s, self.queue.watermark))

            def describe(job: int, group_indices: list[int], rows: list[int]) -> None:
                messages.put(("job", s, job, tuple(group_indices), list(rows)))

        step = StreamedStep(self, self.recipe.algorithm.off_policy, jobs, describe)
        groups: list[Any] = []
        part = None
        try:
            while len(groups) < need or step.pending():
                await self._receive(0.0)  # whatever arrived during the last job
                got = self._pick(s, need - len(groups)) if len(groups) < need else []
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
                    await self._receive(0.05, f"the groups of step {s + 1} ({len(groups)} of {need} here)")
            if jobs is not None and jobs.close():
                with timer("wait_jobs"):  # the jobs the generator took
                    while not (jobs.posted(s) and s in self._parts):
                        await self._receive(0.01, f"the update jobs of step {s + 1} it took")
                part = self._parts.pop(s)
                jobs.add_posted_into(trainable_parameters(self.model))
            verdict = self.outage.judge(_trajectories(groups), s + 1)
            if verdict is not Verdict.TRAIN:
                step.abort()
                return groups, verdict, {}
            with timer("update"):
                metrics = await asyncio.to_thread(step.finish, part)
        except BaseException:
            step.abort()
            raise
        if jobs is not None:
            metrics.update({"async/generator_update_jobs": float(part.jobs if part else 0),
                            "async/generator_update_rows": float(part.rows if part else 0),
                            "async/generator_update_s": float(part.seconds if part else 0.0)})
        return groups, verdict, metrics

    async def _wait_ready(self) -> None:
        proc, results = self.launch.proc, self.launch.results
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            for kind, body in await asyncio.to_thread(drain, results, 0.2):
                if kind == "ready":
                    logger.info("generator process %s ready (policy version %s)", body["pid"], body["version"])
                    return
                self._take((kind, body))
            if not proc.is_alive():
                raise RLFactoryError(f"the generator process exited (code {proc.exitcode}) while starting")
            if time.monotonic() > deadline:
                raise RLFactoryError(f"the generator process did not start within {READY_TIMEOUT_S:.0f} s")

    def _async_metrics(self, timer: StageTimer, prev: dict[str, float]) -> dict[str, float]:
        now = self._gen_stats

        def delta(key: str) -> float:
            return float(now.get(key, 0.0) - prev.get(key, 0.0))

        wall = delta("wall_s")
        wait_groups, wait_jobs = timer.seconds.get("wait", 0.0), timer.seconds.get("wait_jobs", 0.0)
        return {
            "async/policy_version": float(self.step - 1),
            "async/dropped_trajectories": float(self._dropped_step),
            "async/dropped_trajectories_total": float(self.queue.dropped_trajectories),
            "async/groups_waiting": float(len(self.queue.pending)),
            "async/weight_push_s": timer.seconds.get("push", 0.0),
            "async/weight_load_s": delta("weight_load_s"),
            "async/weight_loads": delta("weight_loads"),
            "async/trainer_idle_s": wait_groups + wait_jobs,
            "async/trainer_wait_groups_s": wait_groups,
            "async/trainer_wait_jobs_s": wait_jobs,
            "async/generator_idle_s": max(0.0, wall - delta("engine_busy_s") - delta("update_s")),
            "async/generator_gated_s": delta("gated_s"),
            **{f"async/{k}": delta(k) for k in ENGINE_COUNTERS.values()},
        }


def _trajectories(groups: list[Any]) -> list[Any]:
    return [x for g in groups for x in g.trajectories]


def train_async(recipe: Any, *, resume: bool = False, progress: bool = False,
                launch: GeneratorLaunch | None = None) -> dict[str, Any]:
    """Run an asynchronous local recipe; returns the summary dict. `launch`: a generator already started for this
    recipe (it is stopped when the run ends, however it ends)."""
    torch.set_num_threads(recipe.trainer.torch_threads)
    trainer = None
    try:
        trainer = AsyncTrainer(recipe, resume=resume, progress=progress, launch=launch)
        return asyncio.run(trainer.run())
    finally:
        launch = trainer.launch if trainer is not None else launch
        if launch is not None:
            launch.stop()
