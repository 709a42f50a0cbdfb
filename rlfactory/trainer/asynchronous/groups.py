"""`GroupQueue`: the finished GRPO groups of an asynchronous run waiting for the trainer, and the run's data position
(for checkpoints).

Groups are numbered by the task draw they came from (`TaskSampler.at`). The position is a watermark (every group
below it was trained or dropped) plus the groups at or above it already done; a resumed run regenerates every
other group from the watermark on. Which groups a step takes is the staleness rule's to say (staleness.py).
"""
from __future__ import annotations

from typing import Any

from rlfactory.trainer.asynchronous.messages import GroupResult


class GroupQueue:
    def __init__(self) -> None:
        self.watermark = 0
        """Every group below this one was trained or dropped."""
        self.done_above: set[int] = set()
        """Groups at or above the watermark trained or dropped."""
        self.pending: dict[int, GroupResult] = {}
        """Finished groups by number."""
        self.dropped_trajectories = 0
        """Trajectories dropped so far (by the generator or the trainer), over the whole run."""

    def add(self, group: GroupResult) -> None:
        self.pending[group.index] = group

    def done(self, index: int) -> None:
        """Group `index` was trained or dropped."""
        self.done_above.add(index)
        while self.watermark in self.done_above:
            self.done_above.discard(self.watermark)
            self.watermark += 1

    def drop(self, index: int, trajectories: int | None = None) -> int:
        """Group `index` is dropped (waiting here, or cancelled in flight with `trajectories` samples); how many
        trajectories that was."""
        group = self.pending.pop(index, None)
        n = len(group.trajectories) if group is not None else int(trajectories or 0)
        self.done(index)
        self.dropped_trajectories += n
        return n

    def next_in_order(self, most: int) -> list[int]:
        """The lowest-numbered groups not yet done, up to `most`, as far as they have all arrived."""
        order: list[int] = []
        i = self.watermark
        while len(order) < most:
            if i not in self.done_above:
                if i not in self.pending:
                    break
                order.append(i)
            i += 1
        return order

    def pop(self, indices: list[int]) -> list[GroupResult]:
        """Take these waiting groups (they are done)."""
        groups = [self.pending.pop(i) for i in indices]
        for i in indices:
            self.done(i)
        return groups

    # ----------------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        return {"watermark": self.watermark, "done_above": sorted(self.done_above),
                "dropped_total": self.dropped_trajectories}

    def load_state(self, state: dict[str, Any]) -> None:
        self.watermark = int(state["watermark"])
        self.done_above = {int(i) for i in state["done_above"]}
        self.dropped_trajectories = int(state.get("dropped_total", 0))
        self.pending.clear()
