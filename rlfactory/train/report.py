"""What a run leaves to read: metrics.jsonl + TensorBoard, transcripts (JSONL per step, one HTML viewer), the
reward-curve PNG, pass@k. `rlfactory report RUN_DIR` rebuilds the PNG and the viewer from the files alone.

Left out: dashboards and experiment trackers (TensorBoard reads the events; anything else can read the JSONL).
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per step to metrics.jsonl (flushed each step) and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, purge_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step drops events a killed run wrote past its last checkpoint.
                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=purge_step)
            except ImportError:
                logger.warning("tensorboard is not installed: metrics go to metrics.jsonl only")

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in row.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self.tb is not None:
            step = int(row["step"])
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        self._f.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise RLFactoryError(f"{run_dir}: no metrics.jsonl (is it a run folder written by `rlfactory train`?)")
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def save_transcripts(path: Path, trajectories: list[Any]) -> None:
    """Trajectories as JSONL (the viewer and `report` read them back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajectories:
            f.write(t.model_dump_json() + "\n")


def load_transcripts(folder: Path) -> list[Any]:
    from rlfactory.rollout.trajectory import Trajectory

    out = []
    for f in sorted(folder.glob("*.jsonl")):
        for ln in f.read_text().splitlines():
            if ln.strip():
                out.append(Trajectory.model_validate_json(ln))
    return out


def pass_at_k(trajectories: list[Any], k: int, threshold: float) -> dict[str, float]:
    """pass@1 (mean success rate) and pass@k (a task is solved when any of its k samples is); success means
    reward >= threshold. With exactly k samples per task the unbiased estimator (Chen et al. 2021,
    https://arxiv.org/abs/2107.03374) reduces to `any`."""
    groups: dict[Any, list[bool]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id or t.task_id, []).append((t.reward or 0.0) >= threshold)
    if not groups:
        return {"pass@1": 0.0, f"pass@{k}": 0.0}
    p1 = sum(sum(v) / len(v) for v in groups.values()) / len(groups)
    pk = sum(1.0 for v in groups.values() if any(v)) / len(groups)
    return {"pass@1": p1, f"pass@{k}": pk}


def plot_rewards(rows: list[dict[str, Any]], path: Path, title: str = "reward") -> Path:
    """reward/mean per step (and eval/reward/mean where present) as a PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows if r.get("reward/mean") is not None]
    rew = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, rew, marker="o", ms=3, lw=1.2, label="train reward/mean")
    if len(rew) >= 5:
        smooth = [sum(rew[max(0, i - 4):i + 1]) / len(rew[max(0, i - 4):i + 1]) for i in range(len(rew))]
        ax.plot(steps, smooth, lw=2.2, alpha=0.8, label="5-step mean")
    ev = [(r["step"], r["eval/reward/mean"]) for r in rows if r.get("eval/reward/mean") is not None]
    if ev:
        ax.plot(*zip(*ev), marker="s", lw=1.5, label="eval reward/mean")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _run_tokenizer(run: Path) -> Any | None:
    """The run's tokenizer (from the resolved recipe.yaml it saved, loaded as training loads it), so the viewer shows
    token texts; None if it cannot be loaded (the viewer then shows token ids)."""
    from rlfactory.config import Recipe
    from rlfactory.train.rollout_side import load_tokenizer

    try:
        return load_tokenizer(Recipe.from_yaml(run / "recipe.yaml"))
    except Exception as e:  # the viewer works without it
        logger.info("report: no tokenizer for token texts (%s)", e)
        return None


def write_report(run_dir: str | Path, *, tokenizer: Any | None = None) -> list[Path]:
    """Regenerate `reward_curve.png` and `transcripts.html` (plus `eval.html` when eval transcripts exist)."""
    from rlfactory.rollout.viewer import write_html

    run = Path(run_dir)
    if not run.is_dir():
        raise RLFactoryError(f"{run}: not a folder (pass the run folder written by `rlfactory train`)")
    rows = read_metrics(run)
    name = run.name
    summary = run / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        name = s.get("name", name)
        if isinstance(s.get("reward_rise"), (int, float)):
            name += (f" — first-5 {s['reward_first5']:.3f}, last-5 {s['reward_last5']:.3f}, "
                     f"rise {s['reward_rise']:+.3f}")
    files = [plot_rewards(rows, run / "reward_curve.png", title=name)]
    trajs = load_transcripts(run / "transcripts")
    if tokenizer is None and trajs:
        tokenizer = _run_tokenizer(run)
    if trajs:
        files.append(write_html(trajs, run / "transcripts.html", title=f"{run.name}: sampled training rollouts",
                                tokenizer=tokenizer))
    evals = load_transcripts(run / "eval")
    if evals:
        files.append(write_html(evals, run / "eval.html", title=f"{run.name}: evaluation rollouts",
                                tokenizer=tokenizer))
    return files
