"""The local engine's synchronous loop: GRPO in one process (CPU, or one GPU when present), a step at a time.

    sample prompts -> rollouts (AgentLoop, current weights) -> rewards -> GRPO update (+ KL to a frozen reference)
    -> (vLLM engine: the new weights sent to it)
    (with `data.skip_settled_epochs`, the draws pass over tasks whose last group scored alike: trainer/settled.py)

`SyncSteps` runs one step; the run around it (run folder, metrics, eval, checkpoints, outages, SIGTERM) is the
scaffold both loops share (run.py). With the HF engine the rollouts generate with the trainer's own model object,
so an optimizer step is already what the next rollout uses; the vLLM engine is sent the new weights after each step.
A rollout that fails is counted (`rollout/errors`) and its tokens are not trained on; a reward function that raises
is counted (`reward/errors`); a tool server that dies costs only error content (the ToolManager restarts it).

`trainer.max_staleness_steps: k >= 1` trains asynchronously instead (asynchronous/); k = 0 is this loop.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from rlfactory.data.seeds import mix_seed
from rlfactory.recipe.schema import Recipe
from rlfactory.report.step_row import step_row
from rlfactory.rollout.engines.protocol import engine_counters
from rlfactory.rollout.horizon import horizon_for_step, stage_for_step
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.rollout_side import RolloutSide, open_rollout_side
from rlfactory.trainer.outage import Verdict
from rlfactory.trainer.run import StageTimer, StepOutcome, TrainingRun
from rlfactory.trainer.settled import settled_draws


class SyncSteps:
    """The synchronous loop's steps (a `run.StepSource`)."""

    def __init__(self, run: TrainingRun):
        self.run = run
        self.side: RolloutSide | None = None

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        pol = self.run.policy
        async with open_rollout_side(self.run.recipe, pol.model, pol.tokenizer, pol.device, self.run.out) as side:
            self.side = side
            try:
                yield
            finally:
                self.side = None

    async def step(self, index: int, timer: StageTimer) -> StepOutcome:
        run, side = self.run, self.side
        r, t = run.recipe, run.recipe.trainer
        with timer("sample"):
            horizon = horizon_for_step(r.rollout.horizon, index)
            if index and horizon != horizon_for_step(r.rollout.horizon, index - 1):
                run.sampler.bring_back()  # a task every sample failed in fewer turns may be solved in more
            draws = run.sampler.next(t.prompts_per_step)
            tasks = [run.tasks[i] for i in draws]
        engine0 = engine_counters(side.engine)
        side.engine.policy_version = index  # stamps the tokens: this step's weights
        with timer("rollout"):
            trajs, roll_m = await side.loop.run_batch(tasks, r.rollout.samples_per_prompt, horizon,
                                                      seed=mix_seed(t.seed, index, 1), branching=True)
        verdict = run.outage.judge(trajs, index + 1)
        if verdict is not Verdict.TRAIN:
            return StepOutcome(verdict, trajs)
        with timer("reward"):
            rew_m = await side.rewards.score(trajs)
        data_m = self._set_aside(draws, trajs)
        with timer("update"):
            upd_m = await asyncio.to_thread(run.update.whole_batch, trajs)
        if not side.shares_policy:
            with timer("push"):  # the engine runs its own copy of the weights
                await side.engine.update_weights(run.policy.model.state_dict())
        # the engine's compute inside the rollout stage (the rest of it is waiting on tools)
        perf = {f"perf/{k}": v - engine0[k] for k, v in engine_counters(side.engine).items()}
        row = step_row(index + 1, trajectories=trajs, reward=rew_m, horizon=horizon,
                       horizon_stage=stage_for_step(r.rollout.horizon, index), rollout=roll_m,
                       parts=[upd_m, perf, data_m])
        return StepOutcome(verdict, trajs, row)

    def _set_aside(self, draws: list[int], trajs: list[Trajectory]) -> dict[str, float]:
        """`data.skip_settled_epochs`: the drawn tasks whose groups scored alike are left out of the next epochs."""
        epochs, sampler = self.run.recipe.data.skip_settled_epochs, self.run.sampler
        if not epochs:
            return {}
        sampler.set_aside(settled_draws(draws, trajs), epochs)
        return {"data/tasks_set_aside": float(sampler.tasks_set_aside()),
                "data/draws_skipped": float(sampler.draws_skipped)}

    async def after_skip(self, outcome: StepOutcome) -> None:
        return None

    async def evaluation_side(self) -> RolloutSide:
        return self.side

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any] | None) -> None:
        return None

    def summary(self) -> dict[str, Any]:
        return {}


def train_local(recipe: Recipe, *, resume: bool = False, progress: bool = False) -> dict[str, Any]:
    """Run the recipe on the local engine, synchronously; returns the summary dict. (`rlfactory.api.train` sends
    recipes with `trainer.max_staleness_steps >= 1` to the asynchronous loop.)"""
    if recipe.trainer.max_staleness_steps >= 1:
        raise ValueError("trainer.max_staleness_steps >= 1 is asynchronous: use rlfactory.api.train (or "
                         "rlfactory.trainer.asynchronous.loop.train_async)")
    run = TrainingRun(recipe, resume=resume, progress=progress)
    return asyncio.run(run.run(SyncSteps(run)))
