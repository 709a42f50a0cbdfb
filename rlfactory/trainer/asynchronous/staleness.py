"""`Staleness`: the one rule of an asynchronous run (`trainer.max_staleness_steps: k >= 1`) about how old a trained
token may be, and everything that follows from it. Both processes hold one, built from the same recipe and the
same shared counter (`Channels.released`): the generator asks it which groups may start and which must be
cancelled, the trainer which groups a step takes.

The rule: step s trains policy version s (s optimizer steps taken) on tokens sampled by versions s-k..s.
- **Admit** (generator): group number i may start while
      live < (v - v0 + k + 1) * prompts_per_step
  where live = groups started, less those dropped or released, v the newest published version and v0 the version
  the generator began at; and never past the run's last step. Before the first push the first step's groups run
  alone and the next step's start once they are done: started together, they would share every decode step and
  arrive about twice as late. Groups consumed in start order are then trained at most k versions after they
  started.
- **Take** (trainer), by `trainer.stale_groups`: `drop` first drops (counts) every waiting group whose oldest policy
  token is older than s - k, then takes the lowest-numbered groups waiting: a straggler never holds a step. `wait`
  takes the lowest-numbered groups not yet done, in order, only once they have arrived: none breaks the bound, and
  a straggler holds its step.
- **Cancel** (generator, `drop` only): a group in flight whose oldest token is older than v - k can never be trained:
  cancel it and count it dropped.
- **Release** (trainer): groups it dropped, or took for a step it skipped (an outage), free their places under the
  bound; the generator reads the count.

Metrics it reports per step: `async/dropped_trajectories` (this step), `async/dropped_trajectories_total`,
`async/groups_waiting`, and the staleness of the step's tokens (`off_policy.staleness_metrics`).
Left out: the off-policy correction of stale tokens (algorithms/off_policy.py).
"""
from __future__ import annotations

from typing import Any, Literal

from rlfactory.algorithms.off_policy import oldest_version, staleness_metrics
from rlfactory.recipe.training import TrainerConfig
from rlfactory.trainer.asynchronous.groups import GroupQueue
from rlfactory.trainer.asynchronous.messages import GroupResult


class Staleness:
    def __init__(self, t: TrainerConfig, released: Any):
        """`t`: the recipe's trainer section; `released`: the shared count of groups the trainer let go (a
        `multiprocessing.Value("q")`)."""
        self.k = t.max_staleness_steps
        self.per_step = t.prompts_per_step
        self.policy: Literal["drop", "wait"] = t.stale_groups
        self.total_steps = t.total_steps
        self.released = released
        self.dropped_this_step = 0
        """Trajectories dropped since the trainer's last `begin_step`."""

    # ------------------------------------------------------------------------------------------- the generator
    def may_admit(self, *, version: int, start_version: int, started: int, dropped: int, running: int) -> bool:
        """Whether the generator may start another group: `started` so far, `dropped` of them cancelled here,
        `running` still in flight, at published `version` (the generator began at `start_version`)."""
        pushes = version - start_version
        live = started - dropped - int(self.released.value)
        if pushes == 0 and live >= self.per_step and running > live - self.per_step:
            return False  # one of the first step's groups still runs
        if live >= (self.total_steps - start_version) * self.per_step:
            return False  # no group past the run's last step: it would never be trained
        return live < (pushes + self.k + 1) * self.per_step

    def must_cancel(self, oldest: int | None, version: int) -> bool:
        """Whether a group in flight whose oldest token was sampled by version `oldest` can no longer be trained,
        now that `version` is published (`drop` only: `wait` trains every group)."""
        return self.policy == "drop" and oldest is not None and oldest < version - self.k

    # ------------------------------------------------------------------------------------------- the trainer
    def begin_step(self) -> None:
        self.dropped_this_step = 0

    def take(self, queue: GroupQueue, step: int, most: int, *, whole: bool = False) -> list[GroupResult]:
        """Up to `most` finished groups for the step at policy version `step`, in the order the policy takes them
        (`whole`: all `most` or none); groups dropped on the way are counted and released."""
        if self.policy == "wait":
            order = queue.next_in_order(most)
            if whole and len(order) < most:
                return []
            return queue.pop(order)
        floor = step - self.k
        for i in sorted(queue.pending):
            if (oldest := oldest_version(queue.pending[i].trajectories)) is not None and oldest < floor:
                self.dropped_this_step += queue.drop(i)
                self.release(1)
        ready = sorted(queue.pending)
        if whole and len(ready) < most:
            return []
        return queue.pop(ready[:most])

    def dropped_by_generator(self, queue: GroupQueue, index: int, trajectories: int) -> None:
        """The generator cancelled group `index` (it counted it itself: nothing to release)."""
        queue.drop(index, trajectories)
        self.dropped_this_step += trajectories

    def release(self, groups: int) -> None:
        """Groups the trainer let go (dropped, or skipped with their step) free their places under the bound."""
        with self.released.get_lock():
            self.released.value += groups

    def metrics(self, queue: GroupQueue, trajectories: list[Any], step: int) -> dict[str, float]:
        """The step's `async/` staleness figures (`step`: the policy version it trained)."""
        return {"async/dropped_trajectories": float(self.dropped_this_step),
                "async/dropped_trajectories_total": float(queue.dropped_trajectories),
                "async/groups_waiting": float(len(queue.pending)), **staleness_metrics(trajectories, step)}
