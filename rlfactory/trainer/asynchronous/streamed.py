"""One GRPO optimizer step built group by group, as an asynchronous run's groups arrive (`StreamedStep`).

The synchronous update waits for the whole batch and then runs its micro-batches. An asynchronous step's groups
come from the generator a few at a time, and the last of them can take a while (a long answer, a slow tool); the
forward/backward of the groups already here then runs while the rest are generated, and only the last arrivals and
the optimizer step are left once the batch is complete.

The gradient is the one `Update.whole_batch` takes, built from the same three steps (`Update.prepare`, `backward`,
`optimizer_step`). Advantages are per group, so each arrival prepares its own batch. Each micro-batch's loss is
aggregated with a normaliser of 1 (a sum); once the last group is in, the gradients (and the summed loss metrics) are
divided by the step's normaliser, its response tokens for `token-mean` or its sequences for the `seq-mean` modes,
which equals normalising each micro-batch by it (up to float rounding).

Used for one mini-batch and one epoch per step without masking (`off_policy.mask_outside`), the defaults (`streams`):
masking must know every token's fate before the loss is normalised, and several updates per step need the whole
batch. Otherwise the asynchronous loop waits for every group and calls `Update.whole_batch`.

A `JobShare` may take some of the step's micro-batches elsewhere (the generator's idle core, shared_update.py): it
re-cuts each arrival's micro-batches and names the ones it offers; the step runs those it can claim, and `finish`
adds what the other worker summed. Left out: how the other worker gets and returns them (the share's business).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Protocol

from rlfactory.algorithms.off_policy import CorrectionTotals
from rlfactory.recipe.schema import Recipe
from rlfactory.recipe.training import OffPolicyConfig
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.trainer.update import SUMMED, Correction, MicroTotals, Prepared, Update


class JobShare(Protocol):
    """Another worker that may run some of a streamed step's micro-batches."""

    def plan(self, update: Update, prep: Prepared, micro: list[list[int]],
             group_indices: list[int]) -> list[tuple[list[int], int | None]]:
        """An arrival's micro-batches (re-cut as the share likes), each with the job number it is offered as, or
        None when only this side runs it."""
        ...

    def claim(self, job: int) -> bool:
        """Take job `job` for this side; False when the other worker has it."""
        ...


def streams(recipe: Recipe) -> bool:
    """Whether an asynchronous step of this recipe can be built group by group."""
    a = recipe.algorithm
    return a.ppo_epochs == 1 and a.mini_batches_per_step == 1 and a.off_policy.mask_outside is None


class StreamedStep:
    """`plan(trajectories)` as groups arrive, `run_next()` while micro-batches are queued, then `finish()` (the
    optimizer step) -> the update's metrics; `abort()` drops what was accumulated."""

    def __init__(self, update: Update, off_policy: OffPolicyConfig | None, share: JobShare | None = None):
        self.update = update
        self.share = share
        # a truncation cap weights tokens; without one there is nothing to correct (masking does not stream)
        self.correction = Correction(off_policy if off_policy is not None and off_policy.is_cap is not None
                                     else None)
        self.acc = MicroTotals()
        self.kept: list[Trajectory] = []
        self.tokens = self.sequences = self.adv_abs_sum = 0.0
        self.rows_with_signal = self.trained_on_infra = 0
        self.todo: list[tuple[Prepared, list[int], int | None]] = []
        """Micro-batches in order: (the arrival's batch, its rows, the job it is offered as)."""
        self.next = 0
        update.policy.optimizer.zero_grad(set_to_none=True)

    def plan(self, trajs: list[Trajectory], group_indices: list[int] | None = None) -> None:
        """Count whole groups' trajectories into the step and queue their micro-batches (offered to the share when
        `group_indices` name the groups, in the order of `trajs`). Infrastructure failures alone add no row to train
        (and an episode that never opened has no prompt to batch)."""
        if all(t.infra_failed for t in trajs):
            return
        prep = self.update.prepare(trajs)
        self.kept += prep.kept
        self.trained_on_infra += prep.trained_on_infra
        self.tokens += prep.tokens
        self.sequences += prep.sequences
        self.adv_abs_sum += prep.adv_abs_sum
        self.rows_with_signal += sum(prep.has_signal)
        micro = self.update.micro_batches(prep, list(range(len(prep.batch))))
        if self.share is not None and group_indices is not None:
            self.todo += [(prep, rows, job) for rows, job in self.share.plan(self.update, prep, micro, group_indices)]
        else:
            self.todo += [(prep, rows, None) for rows in micro]

    def run_next(self) -> bool:
        """Forward/backward of the next queued micro-batch this side may run; False when none is left."""
        while self.next < len(self.todo):
            prep, rows, job = self.todo[self.next]
            self.next += 1
            if job is not None and not self.share.claim(job):
                continue  # the other worker runs it
            self.update.normalise_by(None)  # a sum: finish divides it
            self.update.backward(prep, rows, self.correction, self.acc)
            return True
        return False

    def add(self, trajs: list[Trajectory]) -> None:
        """`plan` and run every queued micro-batch (tests, and callers without anything to interleave)."""
        self.plan(trajs)
        while self.run_next():
            pass

    def pending(self) -> bool:
        return self.next < len(self.todo)

    def finish(self, other: MicroTotals | None = None, other_totals: CorrectionTotals | None = None
               ) -> dict[str, float]:
        """Normalise, clip and step; the step's metrics (the keys `Update.whole_batch` reports). `other`,
        `other_totals`: what the share's worker summed over the jobs it ran (its gradient is in the parameters'
        already)."""
        if other is not None:
            for k, v in other.sums.items():
                self.acc.sums.setdefault(k, []).extend(v)
            self.acc.ent_sum += other.ent_sum
            self.acc.ent_tokens += other.ent_tokens
        if other_totals is not None:
            for f in fields(other_totals):
                setattr(self.correction.totals, f.name,
                        getattr(self.correction.totals, f.name) + getattr(other_totals, f.name))
        scale = self.update.loss_normaliser(self.tokens, self.sequences)
        grad_norm = self.update.optimizer_step(scale)
        for k in SUMMED:
            if k in self.acc.sums:
                self.acc.sums[k] = [v / scale for v in self.acc.sums[k]]
        return self.update.metrics(
            self.kept, self.acc, 1, [grad_norm], adv_abs_mean=self.adv_abs_sum / max(self.tokens, 1.0),
            tokens=self.tokens, trained_on_infra=self.trained_on_infra, rows_with_signal=self.rows_with_signal,
            totals=self.correction.totals if self.correction.config is not None else None)

    def abort(self) -> None:
        self.update.policy.optimizer.zero_grad(set_to_none=True)
