"""`GroupQueue`: the finished GRPO groups of an asynchronous run waiting for the trainer, which of them a step
takes, and the run's data position (for checkpoints).

Groups are numbered by the task draw they came from (`TaskSampler.at`). The position is a watermark (every group
below it was trained or dropped) plus the groups at or above it already done; a resumed run regenerates every
other group from the watermark on.

Which groups a step at policy version s takes (`trainer.stale_groups`):
- `drop`: first drop every waiting group whose oldest policy token is older than s - k (counted), then take the
  `need` lowest-numbered groups waiting. A straggler never holds a step; it is trained late or dropped.
- `wait`: take the `need` lowest-numbered groups not yet done, and only once all of them have arrived. Groups
  start in order and at most (k + 1) steps' worth run ahead, so none breaks the bound; a straggler holds its step.
A step built as its groups arrive takes them in the same order, as many as are ready each time (`take_ready`).
"""
from __future__ import annotations

from typing import Any, Literal

from rlfactory.algorithms.off_policy import oldest_version


class GroupQueue:
    def __init__(self, need: int, k: int, policy: Literal["drop", "wait"]):
        self.need, self.k, self.policy = need, k, policy
        self.watermark = 0
        """Every group below this one was trained or dropped."""
        self.done_above: set[int] = set()
        """Groups at or above the watermark trained or dropped."""
        self.pending: dict[int, Any] = {}
        """Finished groups (`GroupResult`) by number."""
        self.dropped_trajectories = 0
        """Trajectories dropped so far (by the generator or here), over the whole run."""

    def add(self, group: Any) -> None:
        self.pending[group.index] = group

    def done(self, index: int) -> None:
        """Group `index` was trained or dropped."""
        self.done_above.add(index)
        while self.watermark in self.done_above:
            self.done_above.discard(self.watermark)
            self.watermark += 1

    def drop(self, index: int, trajectories: int) -> None:
        self.done(index)
        self.dropped_trajectories += trajectories

    def take(self, step: int) -> tuple[list[Any] | None, int]:
        """(the groups to train at policy version `step`, or None while too few are ready; how many waiting groups
        were dropped just now for breaking the bound)."""
        groups, dropped = self.take_ready(step, self.need, whole=True)
        return groups or None, dropped

    def take_ready(self, step: int, most: int, *, whole: bool = False) -> tuple[list[Any], int]:
        """Up to `most` groups for policy version `step` that are ready now, in the order the policy takes them
        (`whole`: all `most` or none); and how many waiting groups were dropped just now for breaking the bound.
        A step built as groups arrive (streamed_update.py) calls this until it holds `need`."""
        if self.policy == "wait":
            order: list[int] = []
            i = self.watermark
            while len(order) < most:
                if i not in self.done_above:
                    if i not in self.pending:
                        break
                    order.append(i)
                i += 1
            if whole and len(order) < most:
                return [], 0
            return self._pop(order), 0
        floor = step - self.k
        dropped = 0
        for i in sorted(self.pending):
            oldest = oldest_version(self.pending[i].trajectories)
            if oldest is not None and oldest < floor:
                self.drop(i, len(self.pending.pop(i).trajectories))
                dropped += 1
        ready = sorted(self.pending)
        if whole and len(ready) < most:
            return [], dropped
        return self._pop(ready[:most]), dropped

    def _pop(self, indices: list[int]) -> list[Any]:
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
