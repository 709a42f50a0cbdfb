"""The dashboard's charts as PNGs, one image per section (`charts_learning.png`, `charts_tools.png`, ...), for papers
and issues. Drawn with matplotlib's object API (no pyplot: no GUI backend, no global state); which curves come from
charts.py, as for the page.

Left out: overlaying several runs (the dashboard does that), the transcript list.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlfactory.report.charts import SECTIONS, ZERO_WHEN_ABSENT, matching, pick_key, series


def panels(rows: list[dict[str, Any]], section: dict[str, Any]) -> list[tuple[str, list[tuple[str, list, list]]]]:
    """(title, [(label, steps, values)]) of each chart of a section that has data, in the page's order."""
    out = []
    for chart_id, title, keys in section["charts"]:
        key = pick_key(rows, keys)
        default = 0.0 if chart_id in ZERO_WHEN_ABSENT and rows else None
        if key is None and default is None:
            continue
        xs, ys = series(rows, key or keys[0], default)
        if xs:
            out.append((f"{title}\n{key or keys[0]}", [(key or keys[0], xs, ys)]))
    for _chart_id, title, pattern in section["multi"]:
        lines = [(label, *series(rows, key)) for key, label in matching(rows, pattern)]
        lines = [ln for ln in lines if ln[1]]
        if lines:
            out.append((title, lines))
    return out


def plot_charts(rows: list[dict[str, Any]], run_dir: str | Path, *, title: str = "") -> list[Path]:
    """Write one PNG per dashboard section that has data into `run_dir`; the paths written."""
    run = Path(run_dir)
    files = []
    for section in SECTIONS:
        if section.get("only_if") and not any(re.match(section["only_if"], k) for r in rows for k in r):
            continue
        charts = panels(rows, section)
        if not charts:
            continue
        cols = min(3, len(charts))
        nrows = math.ceil(len(charts) / cols)
        fig = Figure(figsize=(4.2 * cols, 3.0 * nrows + 0.5), dpi=110)
        for i, (name, lines) in enumerate(charts):
            ax = fig.add_subplot(nrows, cols, i + 1)
            for label, xs, ys in lines:
                ax.plot(xs, ys, marker="o", ms=2.5, lw=1.3, label=label)
            ax.set_title(name, fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if "\n" not in name:  # a multi-series chart: its legend names the series
                ax.legend(fontsize=6, loc="best")
        fig.suptitle(f"{title}: {section['title']}" if title else section["title"], fontsize=11)
        fig.tight_layout()
        path = run / f"charts_{section['id']}.png"
        fig.savefig(path)
        files.append(path)
    return files
