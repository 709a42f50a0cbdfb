"""`TrainingRun`: what both local loops share, the step scaffold. A loop is a `StepSource` that runs one step (the
synchronous loop, loop.py; the asynchronous one, asynchronous/loop.py); the run does the rest, the same for both:

    run folder (a fresh run's outputs cleared, or a resume: checkpoint, data position, changed fields)
    -> the source opens (tool servers, engine or generator process) -> for each step:
         source.step (a timer per stage) -> skipped (an outage: outage.py) or trained
         -> the row (report/step_row.py, plus timings) -> transcripts -> eval -> checkpoint -> SIGTERM?
    -> summary.json and the report

The run folder holds metrics.jsonl (one object per step), TensorBoard events, summary.json, sampled transcripts
(JSONL + the HTML viewer), the reward-curve PNG and checkpoints. Same seed, same metrics in the synchronous loop:
prompts, sampling seeds and transcript picks derive from (seed, step), and a resumed run restores RNG and data
position. SIGTERM (a preemptible cluster's notice) ends the run after the step in progress, with a checkpoint.
Left out: the steps themselves (the sources), the update (update.py), multi-GPU (use `engine: verl`).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlfactory.data.seeds import mix_seed
from rlfactory.data.tasks import TaskSampler, load_tasks
from rlfactory.recipe.schema import Recipe
from rlfactory.report.metrics import MetricsLog, reward_summary
from rlfactory.report.run_folder import clear_run_outputs
from rlfactory.report.run_report import write_report
from rlfactory.report.transcripts import save_transcripts
from rlfactory.rollout.horizon import stage_for_step
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.rollout_side import RolloutSide
from rlfactory.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlfactory.trainer.evaluate import evaluate_on
from rlfactory.trainer.outage import OutageGuard, Verdict
from rlfactory.trainer.policy import Policy
from rlfactory.trainer.progress import StepProgress
from rlfactory.trainer.resume_changes import check_resume, describe, record_resume
from rlfactory.trainer.update import Update

logger = logging.getLogger(__name__)

NON_DETERMINISTIC_PREFIXES = ("perf/", "time/")
"""Metric prefixes that measure wall-clock time: excluded when comparing runs for determinism."""


class StageTimer:
    """Seconds per named stage of one step: `with timer("rollout"): ...` -> metrics `perf/rollout_s`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"perf/{k}_s": v for k, v in self.seconds.items()}


@dataclass
class StepOutcome:
    """What one step gave: the outage guard's verdict, the trajectories, and (when trained) the row so far."""

    verdict: Verdict
    trajectories: list[Trajectory]
    row: dict[str, Any] = field(default_factory=dict)
    """`report.step_row.step_row` of the trained step; the run adds timings, eval and elapsed time."""
    groups: int = 0
    """GRPO groups the step took (the asynchronous loop releases those of a skipped step)."""


class StepSource(Protocol):
    """One loop's way of running steps."""

    def open(self) -> AbstractAsyncContextManager[None]:
        """Start what the steps need (tool servers and engine, or the generator process) for the whole run."""
        ...

    async def step(self, index: int, timer: StageTimer) -> StepOutcome:
        """Run step `index` (0-based; the policy is at version `index`). On TRAIN the update is applied and the new
        weights reach the generation side (version index + 1)."""
        ...

    async def after_skip(self, outcome: StepOutcome) -> None:
        """A skipped step's groups, once the outage pause is over."""
        ...

    async def evaluation_side(self) -> RolloutSide:
        """A rollout side generating with the trainer's current weights (for `trainer.eval_every_steps`)."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """The source's part of a checkpoint's state (called before the run's data position is read)."""
        ...

    def restore(self, state: dict[str, Any] | None) -> None:
        """After the run folder is prepared: the resumed checkpoint's state, or None for a fresh run."""
        ...

    def summary(self) -> dict[str, Any]:
        """The source's fields of summary.json."""
        ...


class TrainingRun:
    """The policy, update, data and run state of a local run; `await run(source)` trains."""

    def __init__(self, recipe: Recipe, *, resume: bool = False, progress: bool = False):
        r = self.recipe = recipe
        self.progress = progress
        self.resume = resume
        self.out = Path(r.trainer.output_dir).resolve()
        self.policy = Policy.load(r)
        self.update = Update(self.policy)
        self.tasks = load_tasks(r.data.train_file, r.data)
        self.val_tasks = load_tasks(r.data.val_file, r.data, r.data.max_val_tasks) if r.data.val_file else []
        self.sampler = TaskSampler(len(self.tasks), r.trainer.seed)
        self.step = 0
        """Optimizer steps taken (the policy version)."""
        self.rewards_so_far: list[float] = []
        self.stopped_by: str | None = None
        """What ended the run before total_steps (`SIGTERM`, `env_outage`, `max_minutes`), if anything."""
        self.outage = OutageGuard(r.trainer.max_env_outage_s)
        """Skips steps with nothing to train on; stops the run when that lasts (outage.py)."""
        self._outage_checkpoint: Path | None = None
        self._source: StepSource | None = None

    # ----------------------------------------------------------------------------------------------- the run
    async def run(self, source: StepSource) -> dict[str, Any]:
        """Train until `trainer.total_steps` (or SIGTERM, or a lasting outage); return the summary (also written to
        summary.json)."""
        t = self.recipe.trainer
        self._source = source
        self._catch_sigterm()
        source.restore(self._prepare_run_dir())
        start_step = self.step
        log = MetricsLog.for_recipe(self.recipe, self.out, purge_step=start_step + 1)
        wall0 = time.perf_counter()
        last_eval: dict[str, Any] = {}
        bar = StepProgress(self.progress, t.total_steps, start_step)
        try:
            async with source.open():
                while self.step < t.total_steps:
                    timer = StageTimer()
                    with timer("step"):
                        outcome = await source.step(self.step, timer)
                    if outcome.verdict is not Verdict.TRAIN:
                        stop = await self._after_skipped_step(outcome.verdict)
                        await source.after_skip(outcome)
                        if stop:
                            break
                        continue
                    index = self.step
                    self.step += 1
                    row = outcome.row
                    self.rewards_so_far.append(row["reward/mean"])
                    row.update(timer.metrics())
                    row["perf/tokens_per_s"] = (sum(sum(x.loss_mask) for x in outcome.trajectories)
                                                / max(timer.seconds["step"], 1e-9))
                    self._save_transcripts(outcome.trajectories, index)
                    if t.eval_every_steps and (self.step % t.eval_every_steps == 0 or self.step == t.total_steps):
                        side = await source.evaluation_side()
                        with timer("eval"):
                            last_eval = await self.evaluate(side, tag=f"step_{self.step:06d}")
                        row.update({f"eval/{k}": v for k, v in last_eval.items() if isinstance(v, (int, float))})
                        row["perf/eval_s"] = timer.seconds["eval"]
                    self._end_step(row, log, bar, wall0)
                    if self._stop_after_step(wall0):
                        break
        finally:
            bar.close()
            log.close()
        return self._finish(start_step, wall0, last_eval, source)

    async def evaluate(self, side: RolloutSide, *, tag: str = "eval", k: int | None = None) -> dict[str, Any]:
        """Mean reward and pass@k on the validation tasks with the current weights; transcripts saved."""
        return await evaluate_on(side, self.recipe, self.val_tasks, self.out, tag=tag, k=k)

    # ----------------------------------------------------------------------------------------------- run folder
    def _prepare_run_dir(self) -> dict[str, Any] | None:
        """A fresh run's folder (what a run writes cleared, the recipe saved): None. A resume: the checkpoint's state
        (the policy, optimizer and data position restored)."""
        self.out.mkdir(parents=True, exist_ok=True)
        ckpt = latest_checkpoint(self.out) if self.resume else None
        if ckpt is None:
            if self.resume:
                logger.info("--resume: no checkpoint in %s yet; starting from step 0", self.out)
            clear_run_outputs(self.out)  # a fresh run is a new run in the trackers too
            (self.out / "recipe.yaml").write_text(self.recipe.to_yaml())
            return None
        pol = self.policy
        changes = check_resume(self.out, self.recipe)  # refuses what a resume cannot change
        state = load_checkpoint(ckpt, model=pol.model, optimizer=pol.optimizer, scheduler=pol.scheduler)
        self.step = int(state["step"])
        if changes:
            logger.warning("--resume at step %d applies: %s", self.step, describe(changes))
            if any(k == "algorithm.learning_rate" for k, _, _ in changes):
                pol.set_learning_rate(self.recipe.algorithm.learning_rate)
        record_resume(self.out, self.step, changes, self.recipe)
        self.sampler.load_state(state["data"])
        self.rewards_so_far = list(state.get("rewards", []))
        _drop_rows_after(self.out / "metrics.jsonl", self.step)  # those steps run again
        return state

    def _save(self) -> Path:
        extra = self._source.checkpoint_state() if self._source is not None else {}
        pol = self.policy
        state = {"data": self.sampler.state(),
                 "horizon_stage": stage_for_step(self.recipe.rollout.horizon, max(self.step - 1, 0)),
                 "rewards": self.rewards_so_far, "seed": self.recipe.trainer.seed, **extra}
        return save_checkpoint(self.out, self.step, model=pol.model, optimizer=pol.optimizer,
                               scheduler=pol.scheduler, state=state, tokenizer=pol.tokenizer,
                               keep=self.recipe.trainer.keep_checkpoints)

    # ----------------------------------------------------------------------------------------------- per step
    def _save_transcripts(self, trajs: list[Trajectory], index: int) -> None:
        """`trainer.log.transcripts_per_step` trajectories of the step, picked by (seed, step); a picked branched
        trajectory brings its whole group, so the viewer and the dashboard show its tree whole."""
        t = self.recipe.trainer
        if t.log.transcripts_per_step:
            pick = set(random.Random(mix_seed(t.seed, index, 2)).sample(
                range(len(trajs)), min(t.log.transcripts_per_step, len(trajs))))
            trees = {trajs[i].group_id for i in pick if trajs[i].branch is not None}
            pick |= {i for i, x in enumerate(trajs) if x.branch is not None and x.group_id in trees}
            save_transcripts(self.out / "transcripts" / f"step_{self.step:06d}.jsonl",
                             [trajs[i] for i in sorted(pick)], t.log.transcript_image_bytes)

    def _catch_sigterm(self) -> None:
        """SIGTERM (a preemptible cluster's notice) ends the run after the step in progress, with a checkpoint."""

        def on_term() -> None:
            logger.warning("SIGTERM: finishing step %d, then saving a checkpoint and stopping (continue with "
                           "--resume)", self.step + 1)
            self.stopped_by = "SIGTERM"

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)

    async def _after_skipped_step(self, verdict: Verdict) -> bool:
        """After a step with nothing to train on (outage.py): True when the run stops here, with a checkpoint (the
        outage lasted `trainer.max_env_outage_s`, or SIGTERM came); else wait a little before the next step."""
        if verdict is Verdict.STOP or self.stopped_by is not None:
            checkpoint = self._save()
            if verdict is Verdict.STOP:
                self.stopped_by, self._outage_checkpoint = "env_outage", checkpoint
            logger.warning("stopped at step %d by %s; checkpoint saved", self.step, self.stopped_by)
            return True
        await self.outage.pause(lambda: self.stopped_by is not None)
        return False

    def _end_step(self, row: dict[str, Any], log: MetricsLog, bar: StepProgress, wall0: float) -> None:
        """Log the step's row and checkpoint when the recipe says so."""
        row["time/elapsed_s"] = time.perf_counter() - wall0  # since the run (tool servers) started
        row.update(self.outage.row_metrics())
        log.write(row)
        bar.update(self.step, row)
        if self._checkpoint_due():
            self._save()

    def _stop_after_step(self, wall0: float) -> bool:
        """True when a SIGTERM asked to stop, or the run's `trainer.max_minutes` are spent: the step just ended is
        checkpointed (unless `_end_step` just did)."""
        t = self.recipe.trainer
        if self.step >= t.total_steps:
            return False
        if self.stopped_by is None and t.max_minutes is not None and time.perf_counter() - wall0 >= 60 * t.max_minutes:
            self.stopped_by = "max_minutes"
        if self.stopped_by is None:
            return False
        if not self._checkpoint_due():
            self._save()
        logger.warning("stopped at step %d by %s; checkpoint saved", self.step, self.stopped_by)
        return True

    def _checkpoint_due(self) -> bool:
        """Whether the step just ended is one the recipe checkpoints (every save_every_steps, and the last)."""
        t = self.recipe.trainer
        return bool(t.save_every_steps and self.step % t.save_every_steps == 0) or self.step == t.total_steps

    def _finish(self, start_step: int, wall0: float, last_eval: dict[str, Any],
                source: StepSource) -> dict[str, Any]:
        """summary.json and the report; returns the summary. Raises EnvOutageError after writing both when an
        outage stopped the run (outage.py)."""
        t = self.recipe.trainer
        summary = {"name": self.recipe.name, "steps": self.step, "resumed_from_step": start_step,
                   **({"stopped_by": self.stopped_by} if self.stopped_by else {}),
                   "skipped_steps": self.outage.skipped_total,
                   "wall_s": time.perf_counter() - wall0, "seed": t.seed, "output_dir": str(self.out),
                   **source.summary(), **reward_summary(self.rewards_so_far), "rewards": self.rewards_so_far}
        if last_eval:
            summary["eval"] = last_eval
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        try:
            write_report(self.out, tokenizer=self.policy.tokenizer)
        except Exception as e:  # plots are a convenience: a failure here must not lose a finished run
            logger.warning("could not write the report: %s", e)
        if self.stopped_by == "env_outage":
            raise self.outage.error(self.step, self._outage_checkpoint)
        return summary


def _drop_rows_after(metrics: Path, step: int) -> None:
    """Keep the rows of steps up to `step` (a resume runs the later ones again); lines that are not rows go too."""
    if not metrics.exists():
        return
    keep = []
    for line in metrics.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict) and row.get("step", 0) <= step:
            keep.append(line)
    metrics.write_text("".join(ln + "\n" for ln in keep))

