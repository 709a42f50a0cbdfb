"""`rlfactory report RUN_DIR`: rebuild a run folder's reward-curve PNG, the dashboard's charts as PNGs and the
transcript viewers from its files alone.

Left out: the live page (`rlfactory dashboard`, dashboard.py) and experiment trackers.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError
from rlfactory.models.loading import load_tokenizer
from rlfactory.recipe.schema import Recipe
from rlfactory.report.chart_pngs import plot_charts
from rlfactory.report.metrics import read_metrics
from rlfactory.report.plots import plot_rewards
from rlfactory.report.transcripts import load_transcripts
from rlfactory.report.viewer import write_html

logger = logging.getLogger(__name__)


def _run_tokenizer(run: Path) -> Any | None:
    """The run's tokenizer (from the resolved recipe.yaml it saved, loaded as training loads it), so the viewer shows
    token texts; None if it cannot be loaded (the viewer then shows token ids)."""
    try:
        return load_tokenizer(Recipe.from_yaml(run / "recipe.yaml"))
    except Exception as e:  # the viewer works without it
        logger.info("report: no tokenizer for token texts (%s)", e)
        return None


def write_report(run_dir: str | Path, *, tokenizer: Any | None = None, charts: bool = False) -> list[Path]:
    """Regenerate `reward_curve.png` and `transcripts.html` (plus `eval.html` when eval transcripts exist); with
    `charts`, also the dashboard's charts as `charts_<section>.png` (`rlfactory report` asks for them; the end of a
    training run does not, so it costs training nothing)."""
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
    if charts:
        files.extend(plot_charts(rows, run, title=run.name))
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
