"""The training progress bar (rich): step, reward, tokens/s and the time left."""
from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class StepProgress:
    """rich progress bar: step, reward, tokens/s and ETA (silent when disabled)."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.p = None
        if not enabled:
            return
        self.p = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("reward {task.fields[reward]}"), TextColumn("{task.fields[tps]} tok/s"),
                          TextColumn("ETA"), TimeRemainingColumn())
        self.p.start()
        self.task = self.p.add_task("train", total=total, completed=done, reward="-", tps="-")

    def update(self, step: int, row: dict[str, Any]) -> None:
        if self.p is not None:
            self.p.update(self.task, completed=step, reward=f"{row.get('reward/mean', float('nan')):.3f}",
                          tps=f"{row.get('perf/tokens_per_s', 0.0):.0f}")

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()
