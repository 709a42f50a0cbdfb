"""The reward curve as a PNG, drawn with matplotlib's object API (no pyplot, so no GUI backend and no global state)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_rewards(rows: list[dict[str, Any]], path: Path, title: str = "reward") -> Path:
    """reward/mean per step (and eval/reward/mean where present) as a PNG."""
    steps = [r["step"] for r in rows if r.get("reward/mean") is not None]
    rew = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    fig = Figure(figsize=(7, 4), dpi=110)
    ax = fig.add_subplot()
    ax.plot(steps, rew, marker="o", ms=3, lw=1.2, label="train reward/mean")
    if len(rew) >= 5:
        smooth = [sum(rew[max(0, i - 4):i + 1]) / len(rew[max(0, i - 4):i + 1]) for i in range(len(rew))]
        ax.plot(steps, smooth, lw=2.2, alpha=0.8, label="5-step mean")
    ev = [(r["step"], r["eval/reward/mean"]) for r in rows if r.get("eval/reward/mean") is not None]
    if ev:
        ax.plot(*zip(*ev), marker="s", lw=1.5, label="eval reward/mean")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
