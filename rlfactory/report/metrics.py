"""metrics.jsonl (one JSON object per step, flushed as it is written) mirrored to the trackers, and reading it back.

Every key written is checked against the metrics registry (metric_names.py): one the registry lacks is logged once,
so the metrics reference cannot silently miss it.

Non-finite values are written as null, so the file stays valid JSON for every reader. Reading is forgiving: the file
may have been edited, concatenated or damaged, so a line that is not one JSON object (bytes that are not UTF-8, JSON
nested past Python's recursion limit, `null`, a list, a line over MAX_LINE_BYTES) is skipped with its reason, never
fatal to the reader. Left out: repairing such lines."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfactory.errors import RLFactoryError
from rlfactory.report.metric_names import warn_unregistered
from rlfactory.report.trackers import close_all, open_trackers, scalars

if TYPE_CHECKING:  # the type only: the dashboard and report read run folders without loading the schema
    from rlfactory.recipe.schema import Recipe

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
    def for_recipe(cls, recipe: Recipe, run_dir: Path, *, purge_step: int | None = None,
                   exclude: tuple[str, ...] = ()) -> "MetricsLog":
        """metrics.jsonl plus the trackers of `trainer.loggers` (less `exclude`)."""
        return cls(run_dir, trackers=open_trackers(recipe, run_dir, purge_step=purge_step, exclude=exclude))

    def write(self, row: dict[str, Any]) -> None:
        warn_unregistered(row, self.path)
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


MAX_LINE_BYTES = 4 * 1024 * 1024
"""The longest metrics.jsonl line a reader parses: one step's row is a few KB even with thousands of tools' counters;
a longer line is damage, and parsing it would cost every reader (the dashboard polls) its size in memory and time."""


class BadMetricsLine(ValueError):
    """A metrics.jsonl line that is not one JSON object; the message says why, for the user to find it."""


def parse_metrics_line(line: bytes) -> dict[str, Any]:
    """One metrics.jsonl line (without its newline) as a row, or BadMetricsLine saying what is wrong with it.

    Integers too long for a float are read as floats (inf past float's range) rather than refused: Python refuses
    to convert integer literals of over 4,300 digits, and no chart can show more than a float anyway."""
    if len(line) > MAX_LINE_BYTES:
        raise BadMetricsLine(f"{len(line):,} bytes, over the {MAX_LINE_BYTES // 2**20} MiB a metrics row may take")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadMetricsLine(f"not UTF-8 text (byte 0x{line[e.start]:02x} at offset {e.start})") from None
    try:
        row = json.loads(text, parse_int=_int_or_float)
    except RecursionError:
        raise BadMetricsLine("JSON nested too deep to read") from None
    except ValueError as e:
        raise BadMetricsLine(f"not JSON ({e})") from None
    if not isinstance(row, dict):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise BadMetricsLine(f"not a JSON object but {type(row).__name__ if row is not None else 'null'}: {shown}")
    return row


def _int_or_float(digits: str) -> int | float:
    return int(digits) if len(digits) <= 18 else float(digits)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of the run's metrics.jsonl; a damaged line is skipped with a warning naming its line number."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise RLFactoryError(f"{run_dir}: no metrics.jsonl (is it a run folder written by `rlfactory train`?)")
    rows = []
    for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rows.append(parse_metrics_line(line))
        except BadMetricsLine as e:
            logger.warning("%s line %d skipped: %s", path, number, e)
    return rows


def reward_summary(rewards: list[float]) -> dict[str, float]:
    """First-5 / last-5 mean reward and the rise, as the quickstart's acceptance reads them."""
    first, last = _mean(rewards[:5]), _mean(rewards[-5:])
    return {"reward_first5": first, "reward_last5": last, "reward_rise": last - first}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")
