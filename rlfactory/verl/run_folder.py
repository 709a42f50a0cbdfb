"""The run folder of a verl run, shaped like a local run's, built while verl trains.

verl's trainer writes one JSON line per step with its own metrics (its `file` logger, `verl_metrics.jsonl`); the
agent-loop workers write one line per trajectory (`records.py`). A thread in the driver joins the two, step by step:

    metrics.jsonl         one object per step: verl's metrics under their own names (`actor/*`, `critic/*`,
                          `training/rollout_actor_probs_pearson_corr`, `timing_s/*`, `trajectory_staleness/*`, ...)
                          and rlfactory's `reward/*`, `rollout/*` and `tools/*`, computed by the same functions as on
                          the local engine, plus `horizon` and `horizon_stage`; verl's losses and stage times are
                          copied under the local engine's names too (`loss/pg`, `perf/step_s`, ...: VERL_NAMES)
    transcripts/          `transcripts_per_step` trajectories of each step (the viewer's input)
    summary.json, reward_curve.png, transcripts.html     when the run ends (`rlfactory report` rebuilds the last two)

verl's checkpoints live in `checkpoints/` (its own layout). On `--resume`, rows and transcripts after verl's last
checkpoint belong to steps that will run again: they are dropped before the run continues, so no step is counted
twice. The other trackers of `trainer.loggers` (wandb, MLflow, Trackio) get every row as it is written. Left out:
TensorBoard events for rlfactory's metrics (verl writes its own under `tensorboard/`).
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from rlfactory.data.seeds import mix_seed
from rlfactory.recipe.schema import Recipe
from rlfactory.report.metrics import MetricsLog, read_metrics, reward_summary
from rlfactory.report.run_report import write_report
from rlfactory.report.step_row import step_row
from rlfactory.report.transcripts import save_transcripts
from rlfactory.reward import combine_reward_metrics
from rlfactory.rollout.horizon import stage_for_step
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.tools.counters import combine_counters
from rlfactory.verl.config import VERL_GENERATIONS_DIR, VERL_METRICS_DIR
from rlfactory.verl.records import read_records

logger = logging.getLogger(__name__)

LATEST_CHECKPOINT_FILE = "latest_checkpointed_iteration.txt"
"""verl's pointer to its newest checkpoint, in `trainer.default_local_dir`."""


def last_checkpoint_step(run_dir: str | Path) -> int:
    """The global step of verl's newest checkpoint in the run folder (0 when there is none)."""
    path = Path(run_dir) / "checkpoints" / LATEST_CHECKPOINT_FILE
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def drop_steps_after(run_dir: str | Path, step: int) -> None:
    """Forget what a killed run wrote past its last checkpoint: those steps run again."""
    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    if metrics.exists():
        keep = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
        metrics.write_text("".join(ln + "\n" for ln in keep))
    for path in (run / "transcripts").glob("step_*.jsonl"):
        if int(path.stem.removeprefix("step_")) > step:
            path.unlink()


RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "reward_curve.png", "transcripts.html", "eval.html", "transcripts",
               "rollouts", "checkpoints", "tensorboard", "trackers.json", "wandb", "mlruns", VERL_METRICS_DIR,
               VERL_GENERATIONS_DIR)
"""What a run leaves in its folder (the inputs `prepare` writes stay)."""


def clear_previous_run(run_dir: str | Path) -> None:
    """A new run in a folder that holds an old one starts clean (as on the local engine): `--resume` continues it."""
    run = Path(run_dir)
    found = [name for name in RUN_OUTPUTS if (run / name).exists()]
    if not found:
        return
    logger.warning("starting a fresh verl run in %s: the previous run's %s are replaced (pass --resume to continue "
                   "it)", run, ", ".join(found))
    for name in found:
        path = run / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def latest_counters(records: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Each worker's newest tool counters among `records` (a worker's counters only grow)."""
    latest: dict[Any, dict[str, Any]] = {}
    for r in records:
        if r.get("tool_counters") is not None:
            key = (r["node"], r["worker"])
            if key not in latest or r["tool_counters"]["calls"] >= latest[key]["calls"]:
                latest[key] = r["tool_counters"]
    return latest


# rlfactory's metric name -> verl's name for the same quantity (verl's own names stay in the row as well).
VERL_NAMES = {
    "loss/pg": "actor/pg_loss", "loss/entropy": "actor/entropy", "loss/ppo_kl": "actor/ppo_kl",
    "loss/kl": "actor/kl_loss", "loss/pg_clipfrac": "actor/pg_clipfrac",
    "loss/pg_clipfrac_lower": "actor/pg_clipfrac_lower", "loss/grad_norm": "actor/grad_norm", "loss/lr": "actor/lr",
    "perf/rollout_s": "timing_s/gen", "perf/reward_s": "timing_s/reward", "perf/update_s": "timing_s/update_actor",
    "perf/step_s": "timing_s/step",
    # verl's one-step off-policy trainer: how many policy versions old a trained trajectory was
    "async/staleness_traj_max": "training/off_policy/trajectory_staleness/max",
    "async/staleness_traj_mean": "training/off_policy/trajectory_staleness/mean",
}


def verl_step_row(recipe: Recipe, step: int, verl_metrics: dict[str, Any], records: list[dict[str, Any]],
                  previous_counters: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """One metrics.jsonl row: verl's metrics of `step` (also under the local engine's names) and rlfactory's, from
    the trajectories recorded for it (`report.step_row`, as the local engine builds its rows).

    `previous_counters` holds each worker's last tool counters before this step; it is updated in place."""
    row: dict[str, Any] = {"step": step}
    row.update(verl_metrics)
    for ours, theirs in VERL_NAMES.items():  # the local engine's names too, so trackers and the dashboard match
        if ours not in row and theirs in verl_metrics:
            row[ours] = verl_metrics[theirs]
    if records:
        trajs = [Trajectory.model_validate(r["trajectory"]) for r in records]
        scored = [r["reward_metrics"] for r in records if r.get("reward_metrics")]
        tools = None
        latest = latest_counters(records)
        if latest:
            before = [previous_counters[k] for k in latest if k in previous_counters]
            tools = combine_counters(list(latest.values()), minus=before)
            previous_counters.update(latest)
        hits = [(c, r["node"]) for r in records for c in r["trajectory"]["tool_calls"] if c.get("cached")]
        ours = {"rollout/nodes": len({r["node"] for r in records}), "tools/cache_hits": len(hits),
                "tools/cache_hits_from_other_nodes": sum(1 for c, node in hits
                                                         if c.get("cache_origin") and c["cache_origin"] != node)}
        matched = [r for r in records if "verl_score" in r]
        if matched:  # verl trains on the score rlfactory's RewardSet gave: a mismatch would be a bridge bug
            ours["reward/verl_score_mismatches"] = sum(
                abs(r["verl_score"] - (r["trajectory"].get("reward") or 0.0)) > 1e-6 for r in matched)
        # scored in the loop (the default); verl's own reward path logs `critic/score/*` instead
        row.update(step_row(step, trajectories=trajs, reward=combine_reward_metrics(scored) if scored else {},
                            horizon=max(int(r["horizon"]) for r in records),
                            horizon_stage=stage_for_step(recipe.rollout.horizon, max(step - 1, 0)), tools=tools,
                            parts=[ours]))
    row.setdefault("horizon_stage", stage_for_step(recipe.rollout.horizon, max(step - 1, 0)))
    return row


def verl_metrics_path(run_dir: str | Path, attempt: str) -> Path:
    """Where verl's `file` logger writes the step lines of one launch."""
    return Path(run_dir) / VERL_METRICS_DIR / f"{attempt}.jsonl"


def catch_up(recipe: Recipe, run_dir: str | Path, up_to: int) -> None:
    """Before a resumed launch: write the rows a killed launch logged but had not yet turned into metrics.jsonl rows
    (it may die between verl's step line and the writer's next poll), for steps up to verl's checkpoint."""
    run = Path(run_dir)
    for path in sorted((run / VERL_METRICS_DIR).glob("*.jsonl")):
        done = max((r["step"] for r in read_metrics_or_empty(run)), default=0)
        if done >= up_to:
            return
        writer = RunFolderWriter(recipe, run, path.stem, start_step=done, until_step=up_to)
        writer.finish(report=False)


def trained_samples(run_dir: str | Path, step: int) -> dict[tuple[str, int], float] | None:
    """What verl trained on at `step`, from its generation dump (`verl_generations/<step>.jsonl`): (uid, sample
    number) -> the score verl used. None until verl has written the file."""
    path = Path(run_dir) / VERL_GENERATIONS_DIR / f"{step}.jsonl"
    if not path.is_file():
        return None
    out: dict[tuple[str, int], float] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return None  # still being written
            row = json.loads(line)
            uid, session, _output = str(row["uid"]).rsplit("_", 2)  # verl's key: {uid}_{session_id}_{output}
            out[(uid, int(session))] = float(row["score"])
    return out


def records_for(samples: dict[tuple[str, int], float], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the trajectories in `samples`, each with the score verl trained on beside it. A sample is
    matched by its group (verl's uid) and number; a trajectory recorded twice (a generation verl aborted and ran
    again) keeps its newest record."""
    newest: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        t = r["trajectory"]
        key = (str(t.get("group_id")), int(t.get("sample_index", 0)))
        if key in samples and (key not in newest or r.get("time", 0) >= newest[key].get("time", 0)):
            newest[key] = {**r, "verl_score": samples[key]}
    return list(newest.values())


class RunFolderWriter:
    """Joins verl's step log and the workers' records into the run folder while verl trains (see the module
    docstring). `start()` runs it in a thread; `finish()` writes what is left, the summary and the report."""

    def __init__(self, recipe: Recipe, run_dir: str | Path, attempt: str, *, start_step: int = 0,
                 until_step: int | None = None, poll_s: float = 2.0):
        self.recipe = recipe
        self.run = Path(run_dir)
        self.attempt = attempt
        self.start_step = start_step
        self.poll_s = poll_s
        self.written_step = start_step
        self.until_step = until_step
        self.rewards: list[float] = [r["reward/mean"] for r in read_metrics_or_empty(self.run)
                                     if r.get("reward/mean") is not None]
        self._counters: dict[Any, dict[str, Any]] = {}
        self._primed = False
        # verl writes its own TensorBoard events; the other trackers get rlfactory's rows, as from the local engine.
        self._log = MetricsLog.for_recipe(recipe, self.run, exclude=("tensorboard",))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    # -- reading ---------------------------------------------------------------------------------------------------
    def _verl_steps(self) -> dict[int, dict[str, Any]]:
        path = verl_metrics_path(self.run, self.attempt)
        steps: dict[int, dict[str, Any]] = {}
        if not path.exists():
            return steps
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n") and line.strip():
                    entry = json.loads(line)
                    steps[int(entry["step"])] = {**steps.get(int(entry["step"]), {}), **entry.get("data", {})}
        return steps

    def poll(self) -> int:
        """Write the rows of every step verl has logged since the last poll; returns how many were written."""
        steps = {s: m for s, m in self._verl_steps().items()
                 if s > self.written_step and (self.until_step is None or s <= self.until_step)}
        if not steps:
            return 0
        records = read_records(self.run, self.attempt)
        if not self._primed:  # rows this launch wrote before (catch-up): their tool counts are the baseline
            self._counters.update(latest_counters([r for r in records if int(r["global_step"]) <= self.written_step]))
            self._primed = True
        written = 0
        for step in sorted(steps):
            samples = trained_samples(self.run, step)
            if samples is None and not self._stop.is_set():
                break  # verl writes its generation dump just after the step's metrics: wait for it
            if samples is not None:
                mine = records_for(samples, records)
            else:  # the run ended without a dump for this step: fall back on verl's step tags
                mine = [r for r in records if int(r["global_step"]) == step]
            row = verl_step_row(self.recipe, step, steps[step], mine, self._counters)
            self._log.write(row)
            if row.get("reward/mean") is not None:
                self.rewards.append(row["reward/mean"])
            self._transcripts(step, mine)
            self.written_step = step
            written += 1
        return written

    def _transcripts(self, step: int, records: list[dict[str, Any]]) -> None:
        n = min(self.recipe.trainer.log.transcripts_per_step, len(records))
        if not n:
            return
        ordered = sorted(records, key=lambda r: r["trajectory"]["id"])
        pick = random.Random(mix_seed(self.recipe.trainer.seed, step, 2)).sample(range(len(ordered)), n)
        save_transcripts(self.run / "transcripts" / f"step_{step:06d}.jsonl",
                         [Trajectory.model_validate(ordered[i]["trajectory"]) for i in sorted(pick)],
                         self.recipe.trainer.log.transcript_image_bytes)

    # -- running ---------------------------------------------------------------------------------------------------
    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.poll_s):
                try:
                    self.poll()
                except Exception as e:  # the run goes on; finish() reads everything again
                    logger.warning("run folder: could not read this poll's records (%s); retrying", e)

        self._thread = threading.Thread(target=loop, name="rlfactory-run-folder", daemon=True)
        self._thread.start()

    def finish(self, *, report: bool = True) -> dict[str, Any]:
        """Stop polling, write the last rows, summary.json and (with `report`) the report; returns the summary."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        self._log.close()
        if not report:
            return {}
        t = self.recipe.trainer
        summary = {"name": self.recipe.name, "engine": "verl", "steps": self.written_step,
                   "resumed_from_step": self.start_step, "wall_s": time.perf_counter() - self._t0, "seed": t.seed,
                   "output_dir": str(self.run), **reward_summary(self.rewards), "rewards": self.rewards}
        (self.run / "summary.json").write_text(json.dumps(summary, indent=1))
        try:
            write_report(self.run)
        except Exception as e:  # plots are a convenience: a failure here must not lose a finished run
            logger.warning("could not write the report: %s", e)
        return summary


def read_metrics_or_empty(run: Path) -> list[dict[str, Any]]:
    return read_metrics(run) if (run / "metrics.jsonl").exists() else []
