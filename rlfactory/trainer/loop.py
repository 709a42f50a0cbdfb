"""The local engine: GRPO in one process (CPU, or one GPU when present), as one linear loop with a timer per stage.

    sample prompts -> rollouts (AgentLoop on the HF engine, current weights) -> rewards -> GRPO advantages
    -> policy loss with the loss mask (+ KL to a frozen reference) -> optimizer step -> metrics / eval / save

The run folder holds metrics.jsonl (one object per step), TensorBoard events, summary.json, sampled transcripts
(JSONL + the HTML viewer), the reward-curve PNG and checkpoints. A rollout that fails is counted
(`rollout/errors`) and its tokens are not trained on; a reward function that raises is counted (`reward/errors`);
a tool server that dies costs only error content (the ToolManager restarts it); a step whose every trajectory failed
for infrastructure reasons is skipped and counted, and an outage that lasts stops the run with a checkpoint
(`outage.py`). Same seed, same metrics: prompts, sampling seeds and transcript picks derive from (seed, step), and a
resumed run restores RNG and data position.

The update itself (advantages, micro-batched forward/backward, the optimizer step) is `update.py`.

`trainer.max_staleness_steps: k >= 1` trains asynchronously instead (`async_loop.py`, same update with an
off-policy correction); k = 0 is this loop, unchanged.
Left out: multi-GPU (use `engine: verl`), sequence packing.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import shutil
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from rlfactory.algorithms.grpo import actor_config
from rlfactory.data.tasks import TaskSampler, load_tasks
from rlfactory.models.devices import avoid_cudnn_attention, resolve_device
from rlfactory.models.loading import load_policy, load_tokenizer
from rlfactory.recipe.schema import Recipe
from rlfactory.report.metrics import MetricsLog, reward_summary
from rlfactory.report.run_report import write_report
from rlfactory.report.transcripts import save_transcripts
from rlfactory.reward import pass_at_k
from rlfactory.rollout.agent_loop import mix_seed
from rlfactory.rollout.engines.protocol import SamplingParams, engine_counters
from rlfactory.rollout.horizon import horizon_for_step, max_horizon, stage_for_step
from rlfactory.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlfactory.trainer.heap import FrozenHeap
from rlfactory.trainer.outage import OutageGuard, Verdict
from rlfactory.trainer.progress import StepProgress
from rlfactory.trainer.resume_changes import check_resume, describe, record_resume
from rlfactory.trainer.update import GRPOUpdate
from rlfactory.trainer.wiring import open_rollout_side

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


def _step_seed(seed: int, step: int, salt: int) -> int:
    return mix_seed(seed, step, salt)


class LocalTrainer(GRPOUpdate):
    """Holds the model, optimizer and run state; `await run()` trains. Built by `train_local(recipe)`."""
    def __init__(self, recipe: Recipe, *, resume: bool = False, progress: bool = False,
                 model_path: str | Path | None = None, for_eval: bool = False):
        """`model_path` replaces `model.path` (a checkpoint's model folder, for eval); `for_eval` skips the
        reference model."""


        self.recipe = r = recipe
        self.progress = progress
        self.out = Path(r.trainer.output_dir).resolve()
        torch.set_num_threads(r.trainer.torch_threads)
        self.device = resolve_device(r.trainer.device)
        avoid_cudnn_attention(self.device)  # training batches change length every step too
        random.seed(r.trainer.seed)
        torch.manual_seed(r.trainer.seed)
        self.tasks = load_tasks(r.data.train_file, r.data)
        self.val_tasks = load_tasks(r.data.val_file, r.data, r.data.max_val_tasks) if r.data.val_file else []
        self.sampler = TaskSampler(len(self.tasks), r.trainer.seed)
        self.tokenizer = load_tokenizer(r, model_path)
        self.model = load_policy(r, self.device, model_path)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        opt = r.algorithm.optimizer
        self.optimizer = torch.optim.AdamW(self.params, lr=r.algorithm.learning_rate, betas=tuple(opt.betas),
                                           weight_decay=opt.weight_decay, eps=opt.eps)
        warm = opt.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: min(1.0, (n + 1) / warm) if warm else 1.0)
        self.ref_model = None if for_eval else self._reference()
        mini_prompts = r.trainer.prompts_per_step // r.algorithm.mini_batches_per_step
        self.actor_cfg = actor_config(r.algorithm, samples_per_prompt=r.rollout.samples_per_prompt,
                                      mini_batch_prompts=mini_prompts)
        self.step = 0
        self.rewards_so_far: list[float] = []
        self.resume = resume
        self.stopped_by: str | None = None
        """What ended the run before total_steps (`SIGTERM`, `env_outage`), if anything."""
        self.outage = OutageGuard(r.trainer.max_env_outage_s)
        """Skips steps with nothing to train on; stops the run when that lasts (outage.py)."""
        self._outage_checkpoint: Path | None = None

    # ----------------------------------------------------------------------------------------------- run folder
    def _prepare_run_dir(self) -> dict[str, Any] | None:
        self.out.mkdir(parents=True, exist_ok=True)
        ckpt = latest_checkpoint(self.out) if self.resume else None
        if self.resume and ckpt is None:
            logger.info("--resume: no checkpoint in %s yet; starting from step 0", self.out)
        if ckpt is None:
            if (self.out / "metrics.jsonl").exists():
                logger.warning("starting a fresh run in %s: the previous run's metrics and checkpoints are "
                               "replaced (pass --resume to continue it)", self.out)

            for name in ("metrics.jsonl", "summary.json", "tensorboard", "transcripts", "checkpoints", "eval",
                         "trackers.json", "wandb", "mlruns"):  # a fresh run is a new run in the trackers too
                p = self.out / name
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
            (self.out / "recipe.yaml").write_text(self.recipe.to_yaml())
            return None
        changes = check_resume(self.out, self.recipe)  # refuses what a resume cannot change
        state = load_checkpoint(ckpt, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        self.step = int(state["step"])
        if changes:
            logger.warning("--resume at step %d applies: %s", self.step, describe(changes))
            if any(k == "algorithm.learning_rate" for k, _, _ in changes):
                self._set_learning_rate(self.recipe.algorithm.learning_rate)
        record_resume(self.out, self.step, changes, self.recipe)
        self.sampler.load_state(state["data"])
        self.rewards_so_far = list(state.get("rewards", []))
        # Rows written after the checkpoint belong to steps that will run again.
        metrics = self.out / "metrics.jsonl"
        if metrics.exists():
            rows = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
            keep = [ln for ln in rows if json.loads(ln).get("step", 0) <= self.step]
            metrics.write_text("".join(ln + "\n" for ln in keep))
        return state

    def _set_learning_rate(self, lr: float) -> None:
        """A new peak learning rate after a resume: the optimizer's and the schedule's, at the schedule's point."""
        self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        for g in self.optimizer.param_groups:
            g["initial_lr"], g["lr"] = lr, lr * factor

    def _save(self) -> Path:
        state = {"data": self.sampler.state(), "horizon_stage": stage_for_step(self.recipe.rollout.horizon,
                                                                                max(self.step - 1, 0)),
                 "rewards": self.rewards_so_far, "seed": self.recipe.trainer.seed, **self._extra_state()}
        return save_checkpoint(self.out, self.step, model=self.model, optimizer=self.optimizer,
                               scheduler=self.scheduler, state=state, tokenizer=self.tokenizer,
                               keep=self.recipe.trainer.keep_checkpoints)

    def _extra_state(self) -> dict[str, Any]:
        """More trainer state for checkpoints (the asynchronous trainer's data position)."""
        return {}

    # ------------------------------------------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        """Train until `trainer.total_steps`; return the summary (also written to summary.json)."""
        r, t = self.recipe, self.recipe.trainer
        self._catch_sigterm()
        self._prepare_run_dir()
        start_step = self.step
        log = MetricsLog.for_recipe(r, self.out, purge_step=start_step + 1)
        wall0 = time.perf_counter()
        last_eval: dict[str, float] = {}
        bar = StepProgress(self.progress, t.total_steps, start_step)
        heap = FrozenHeap()
        heap.freeze()  # the imports and the model; again once the tool servers are up
        try:
            async with open_rollout_side(r, self.model, self.tokenizer, self.device, self.out) as side:
                heap.freeze()
                while self.step < t.total_steps:
                    step_idx = self.step  # 0-based index of the step about to run
                    timer = StageTimer()
                    with timer("step"):
                        with timer("sample"):
                            tasks = [self.tasks[i] for i in self.sampler.next(t.prompts_per_step)]
                            horizon = horizon_for_step(r.rollout.horizon, step_idx)
                        engine0 = engine_counters(side.engine)
                        side.engine.policy_version = self.step  # stamps the tokens: this step's weights
                        with timer("rollout"):
                            trajs, roll_m = await side.loop.run_batch(
                                tasks, r.rollout.samples_per_prompt, horizon, seed=_step_seed(t.seed, step_idx, 1))
                        verdict = self.outage.judge(trajs, step_idx + 1)
                        if verdict is Verdict.TRAIN:
                            with timer("reward"):
                                rew_m = await side.rewards.score(trajs)
                            with timer("update"):
                                upd_m = await asyncio.to_thread(self._update, trajs)
                    if verdict is not Verdict.TRAIN:
                        if await self._after_skipped_step(verdict):
                            break
                        continue
                    self.step += 1
                    self.rewards_so_far.append(rew_m["reward/mean"])
                    row: dict[str, Any] = {"step": self.step, "horizon": horizon,
                                           "horizon_stage": stage_for_step(r.rollout.horizon, step_idx)}
                    row.update(rew_m)
                    row.update(roll_m)
                    row.update(upd_m)
                    row.update(timer.metrics())
                    gen_tokens = sum(sum(x.loss_mask) for x in trajs)
                    row["perf/tokens_per_s"] = gen_tokens / max(timer.seconds["step"], 1e-9)
                    # Engine compute inside the rollout stage (the rest of it is waiting on tools).
                    row.update({f"perf/{k}": v - engine0[k] for k, v in engine_counters(side.engine).items()})
                    self._save_transcripts(trajs, step_idx)
                    if t.eval_every_steps and (self.step % t.eval_every_steps == 0 or self.step == t.total_steps):
                        with timer("eval"):
                            last_eval = await self.evaluate(side, tag=f"step_{self.step:06d}")
                        row.update({f"eval/{k}": v for k, v in last_eval.items() if isinstance(v, (int, float))})
                        row["perf/eval_s"] = timer.seconds["eval"]
                    self._end_step(row, log, bar, wall0)
                    if self._stop_after_step():
                        break
        finally:
            bar.close()
            log.close()
            heap.thaw()
        return self._finish(start_step, wall0, last_eval)

    # ------------------------------------------------------------------------- per step and end (both loops)
    def _save_transcripts(self, trajs: list[Any], step_idx: int) -> None:
        """`trainer.log.transcripts_per_step` trajectories of the step, picked by (seed, step)."""
        t = self.recipe.trainer
        if t.log.transcripts_per_step:
            pick = random.Random(_step_seed(t.seed, step_idx, 2)).sample(
                range(len(trajs)), min(t.log.transcripts_per_step, len(trajs)))
            save_transcripts(self.out / "transcripts" / f"step_{self.step:06d}.jsonl",
                             [trajs[i] for i in sorted(pick)])

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

    def _stop_after_step(self) -> bool:
        """True when a SIGTERM asked to stop: the step just ended is checkpointed (unless `_end_step` just did)."""
        if self.stopped_by is None or self.step >= self.recipe.trainer.total_steps:
            return False
        if not self._checkpoint_due():
            self._save()
        logger.warning("stopped at step %d by %s; checkpoint saved", self.step, self.stopped_by)
        return True

    def _end_step(self, row: dict[str, Any], log: Any, bar: Any, wall0: float) -> None:
        """Log the step's row and checkpoint when the recipe says so."""
        row["time/elapsed_s"] = time.perf_counter() - wall0  # since the run (tool servers) started
        row.update(self.outage.row_metrics())
        log.write(row)
        bar.update(self.step, row)
        if self._checkpoint_due():
            self._save()

    def _checkpoint_due(self) -> bool:
        """Whether the step just ended is one the recipe checkpoints (every save_every_steps, and the last)."""
        t = self.recipe.trainer
        return bool(t.save_every_steps and self.step % t.save_every_steps == 0) or self.step == t.total_steps

    def _finish(self, start_step: int, wall0: float, last_eval: dict[str, Any],
                **extra: Any) -> dict[str, Any]:
        """summary.json (with `extra` fields) and the report; returns the summary. Raises EnvOutageError after
        writing both when an outage stopped the run (outage.py)."""
        t = self.recipe.trainer
        summary = {"name": self.recipe.name, "steps": self.step, "resumed_from_step": start_step,
                   **({"stopped_by": self.stopped_by} if self.stopped_by else {}),
                   "skipped_steps": self.outage.skipped_total,
                   "wall_s": time.perf_counter() - wall0, "seed": t.seed, "output_dir": str(self.out), **extra,
                   **reward_summary(self.rewards_so_far), "rewards": self.rewards_so_far}
        if last_eval:
            summary["eval"] = last_eval
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        try:
            write_report(self.out, tokenizer=self.tokenizer)
        except Exception as e:  # plots are a convenience: a failure here must not lose a finished run
            logger.warning("could not write the report: %s", e)
        if self.stopped_by == "env_outage":
            raise self.outage.error(self.step, self._outage_checkpoint)
        return summary

    async def evaluate(self, side: Any, *, tag: str = "eval", k: int | None = None) -> dict[str, Any]:
        """Mean reward and pass@k on the validation tasks with the current weights; transcripts saved."""
        t = self.recipe.trainer
        k = k or t.eval_samples_per_prompt
        base = side.loop.default_sampling()
        sampling: SamplingParams = base.model_copy(update={"temperature": t.eval_temperature})
        trajs, roll_m = await side.loop.run_batch(self.val_tasks, k, max_horizon(self.recipe.rollout.horizon),
                                                  seed=_step_seed(t.seed, 10**6, 3), sampling=sampling)
        rew_m = await side.rewards.score(trajs)
        res = pass_at_k(trajs, k, t.eval_success_threshold)
        res.update({"reward/mean": rew_m["reward/mean"], "tasks": len(self.val_tasks), "k": k,
                    "rollout/tool_calls_mean": roll_m.get("rollout/tool_calls_mean", 0.0),
                    "rollout/errors": roll_m.get("rollout/errors", 0)})
        save_transcripts(self.out / "eval" / f"{tag}.jsonl", trajs)
        (self.out / "eval" / f"{tag}.json").write_text(json.dumps(res, indent=1))
        return res


def train_local(recipe: Recipe, *, resume: bool = False, progress: bool = False) -> dict[str, Any]:
    """Run the recipe on the local engine, synchronously; returns the summary dict. (`rlfactory.api.train` sends
    recipes with `trainer.max_staleness_steps >= 1` to `async_loop.train_async`.)"""
    if recipe.trainer.max_staleness_steps >= 1:
        raise ValueError("trainer.max_staleness_steps >= 1 is asynchronous: use rlfactory.api.train (or "
                         "rlfactory.trainer.async_loop.train_async)")
    trainer = LocalTrainer(recipe, resume=resume, progress=progress)
    return asyncio.run(trainer.run())
