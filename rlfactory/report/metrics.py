"""metrics.jsonl (one JSON object per step, flushed as it is written) mirrored to the trackers, and reading it back.

Non-finite values are written as null, so the file stays valid JSON for every reader."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError
from rlfactory.report.trackers import close_all, open_trackers, scalars

logger = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per step to metrics.jsonl (flushed each step) and hands its numbers to the trackers
    (trackers.py: TensorBoard, wandb, MLflow, Trackio)."""

    def __init__(self, run_dir: Path, *, trackers: list[Any] | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a")
        self.trackers = list(trackers or [])

    @classmethod
    def for_recipe(cls, recipe: Any, run_dir: Path, *, purge_step: int | None = None,
                   exclude: tuple[str, ...] = ()) -> "MetricsLog":
        """metrics.jsonl plus the trackers of `trainer.loggers` (less `exclude`)."""
        return cls(run_dir, trackers=open_trackers(recipe, run_dir, purge_step=purge_step, exclude=exclude))

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in row.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self.trackers:
            step, values = int(row["step"]), scalars(row)
            for tracker in list(self.trackers):
                try:
                    tracker.log(values, step)
                except Exception as e:  # metrics.jsonl has the row; a tracker going away must not stop training
                    logger.warning("the %s tracker failed at step %d (%r): it gets no more metrics this run",
                                   tracker.name, step, e)
                    self.trackers.remove(tracker)

    def close(self) -> None:
        self._f.close()
        close_all(self.trackers)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise RLFactoryError(f"{run_dir}: no metrics.jsonl (is it a run folder written by `rlfactory train`?)")
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def reward_summary(rewards: list[float]) -> dict[str, float]:
    """First-5 / last-5 mean reward and the rise, as the quickstart's acceptance reads them."""
    first, last = _mean(rewards[:5]), _mean(rewards[-5:])
    return {"reward_first5": first, "reward_last5": last, "reward_rise": last - first}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")
