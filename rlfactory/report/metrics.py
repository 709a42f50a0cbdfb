"""metrics.jsonl (one JSON object per step, flushed as it is written) mirrored to TensorBoard, and reading it back.

Non-finite values are written as null, so the file stays valid JSON for every reader."""
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
                from torch.utils.tensorboard import SummaryWriter  # optional (trainer.log.tensorboard), ~1 s

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


def reward_summary(rewards: list[float]) -> dict[str, float]:
    """First-5 / last-5 mean reward and the rise, as the quickstart's acceptance reads them."""
    first, last = _mean(rewards[:5]), _mean(rewards[-5:])
    return {"reward_first5": first, "reward_last5": last, "reward_rise": last - first}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")
