"""One GRPO optimizer step built group by group, as an asynchronous run's groups arrive (`StreamedStep`).

The synchronous update waits for the whole batch and then runs its micro-batches. An asynchronous step's groups
come from the generator one at a time, and the last of them can take a while (a long answer, a slow tool); the
forward/backward of the groups already here then runs while the rest are generated, and only the last arrivals
and the optimizer step are left once the batch is complete.

The gradient is the one `GRPOUpdate._update` takes. Advantages are per group, so each arrival computes its own.
Each micro-batch's loss is aggregated with a normaliser of 1 (a sum); once the last group is in, the gradients
(and the summed loss metrics) are divided by the mini-batch's normaliser, its response tokens for `token-mean`
or its sequences for the `seq-mean` modes, which equals normalising each micro-batch by it (up to float rounding).
Then they are clipped and the optimizer steps.

Each arrival's micro-batches are queued as jobs and run in order (`plan`, `run_next`). When the step is shared with
the generator (update_jobs.py), the arrival's longest rows are cut into small jobs at the end of the queue, which
the generator's idle decoding thread may take; their summed gradient and metrics join the step in `finish`.

Used for one mini-batch and one epoch per step without masking (`off_policy.mask_outside`), the defaults: masking
must know every token's fate before the loss is normalised, and several updates per step need the whole batch.
Otherwise the asynchronous loop waits for every group and calls `_update`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from rlfactory.algorithms.grpo import build_batch, compute_advantages, exclude_infra_failures, trained_on_infra_failures
from rlfactory.algorithms.off_policy import CorrectionTotals
from rlfactory.models.loading import pad_id_of
from rlfactory.trainer.micro_batches import length_buckets
from rlfactory.trainer.update import SUMMED, MicroTotals
from rlfactory.trainer.update_jobs import JOB_ROWS, TAIL_JOBS


def streams(recipe: Any) -> bool:
    """Whether an asynchronous step of this recipe can be built group by group."""
    a = recipe.algorithm
    return a.ppo_epochs == 1 and a.mini_batches_per_step == 1 and a.off_policy.mask_outside is None


@dataclass
class Arrival:
    """Groups that arrived together, as one batch: what their jobs (micro-batches) are cut from. Both processes
    build it the same way from the same trajectories (`arrival`)."""

    batch: Any
    advantages: torch.Tensor
    kept: list[Any]
    micro: list[list[int]]
    """The micro-batches: rows of `batch` with signal (or every row), by `length_buckets`."""
    trained_on_infra: int
    has_signal: list[bool]


def arrival(host: Any, trajs: list[Any], max_rows: int, tail: tuple[int, int] | None = None) -> Arrival | None:
    """The batch, advantages and micro-batches (at most `max_rows` rows) of arrived trajectories; None when every
    one was an infrastructure failure (they would add no row to train, and an episode that never opened has no
    prompt to batch). `tail` = (pieces, rows): the last pieces x rows rows (the longest) are cut
    into pieces of that many rows, the jobs a shared update's generator takes (update_jobs.py)."""
    a = host.recipe.algorithm
    hit = [t.infra_failed for t in trajs]
    if all(hit):
        return None
    kept = exclude_infra_failures(trajs)  # out of the loss and of their groups' statistics
    batch = build_batch(kept, pad_id_of(host.tokenizer))
    advantages = compute_advantages(batch, norm_adv_by_std=a.norm_adv_by_std)
    has_signal, lengths, prompt_of = host._row_plan(batch, advantages)
    rows = list(range(len(batch)))
    if host._only_signal_rows():
        rows = [i for i in rows if has_signal[i]]
    micro = length_buckets(rows, lengths, max_rows, prompt_of)
    if tail is not None:
        pieces, piece_rows = tail
        ordered = [i for m in micro for i in m]  # shortest to longest
        n_tail = min(len(ordered), pieces * piece_rows)
        head, last = ordered[:len(ordered) - n_tail], ordered[len(ordered) - n_tail:]
        micro = length_buckets(head, lengths, max_rows, prompt_of) + [
            sorted(last[i:i + piece_rows]) for i in range(0, n_tail, piece_rows)]
    return Arrival(batch, advantages, kept, micro, trained_on_infra_failures(hit, batch), has_signal)


def sum_losses(host: Any) -> None:
    """Aggregate each micro-batch's loss with a normaliser of 1 (a sum); `finish` divides the total."""
    info = host.actor_cfg.global_batch_info
    info.update(dp_size=1, batch_num_tokens=1.0, global_batch_size=1.0,
                loss_scale_factor=host.actor_cfg.loss_scale_factor)


def run_micro(host: Any, arr: Arrival, rows: list[int], correction: Any, totals: CorrectionTotals,
              acc: MicroTotals) -> None:
    """Forward/backward of micro-batch `rows` of `arr`, adding to the host's parameters' gradients."""
    sum_losses(host)
    host.model.train()
    try:
        host._micro_backward(arr.batch, arr.advantages, rows, correction, None, None, totals, acc)
    finally:
        host.model.eval()


def step_correction(correction: Any) -> Any:
    """The correction a streamed step applies: None without a truncation cap (nothing to weight)."""
    return None if correction is None or correction.is_cap is None else correction


class StreamedStep:
    """`add(trajectories)` as groups arrive (forward/backward), then `finish()` (the optimizer step) -> metrics.
    `host` is the `GRPOUpdate` (the trainer).

    Shared with the generator (`jobs`, an `UpdateJobs` opened for this step, and `describe(job, group_indices,
    rows)` sending a job's description to it): `plan(trajectories, group_indices)` announces an arrival's
    micro-batches as jobs, `run_next()` claims and runs them in order (skipping those the generator took), and
    `finish(part)` adds the generator's posted gradient and metrics."""

    def __init__(self, host: Any, correction: Any, jobs: Any = None, describe: Any = None):
        self.host = host
        self.correction = step_correction(correction)
        self.totals = CorrectionTotals()
        self.acc = MicroTotals()
        self.kept: list[Any] = []
        self.tokens = self.sequences = self.adv_abs_sum = 0.0
        self.rows_with_signal = self.trained_on_infra = 0
        self.jobs, self.describe = jobs, describe
        self.todo: list[tuple[Arrival, list[int], bool]] = []
        """Jobs in order: (arrival, rows, shared with the generator)."""
        self.next = 0
        self.tail = (TAIL_JOBS, JOB_ROWS) if jobs is not None else None
        host.optimizer.zero_grad(set_to_none=True)

    def add(self, trajs: list[Any]) -> None:
        """Forward/backward of whole groups' trajectories (run in a worker thread)."""
        self.plan(trajs)
        while self.run_next():
            pass

    def plan(self, trajs: list[Any], group_indices: list[int] | None = None) -> None:
        """Count whole groups' trajectories into the step and queue their micro-batches (announced to the generator
        when shared and `group_indices` name the groups, in the order of `trajs`)."""
        arr = arrival(self.host, trajs, self.host.recipe.algorithm.micro_batch_size,
                      self.tail if group_indices is not None else None)
        if arr is None:
            return
        self.kept += arr.kept
        self.trained_on_infra += arr.trained_on_infra
        mask = arr.batch.response_mask
        self.tokens += float(mask.sum())
        self.sequences += float((mask.sum(-1) > 0).sum())
        self.adv_abs_sum += float((arr.advantages.abs() * mask).sum())
        self.rows_with_signal += sum(arr.has_signal)
        for rows in arr.micro:
            j = len(self.todo)
            shared = False
            if self.jobs is not None and group_indices is not None:
                self.describe(j, group_indices, rows)
                shared = self.jobs.add_job(j)
            self.todo.append((arr, rows, shared))

    def run_next(self) -> bool:
        """Run the next queued job the generator has not taken; False when none is left."""
        while self.next < len(self.todo):
            arr, rows, shared = self.todo[self.next]
            self.next += 1
            if shared and not self.jobs.claim(self.next - 1):
                continue  # the generator runs it
            run_micro(self.host, arr, rows, self.correction, self.totals, self.acc)
            return True
        return False

    def pending(self) -> bool:
        return self.next < len(self.todo)

    def normaliser(self) -> float:
        mode = self.host.actor_cfg.loss_agg_mode
        if mode == "token-mean":
            return max(self.tokens, 1.0)
        if mode.startswith("seq-mean"):
            return max(self.sequences, 1.0)
        return 1.0  # token-sum

    def finish(self, part: "UpdatePart | None" = None) -> dict[str, float]:
        """Normalise, clip and step; the step's metrics (the keys `_update` reports). `part`: the metrics of the
        jobs the generator ran, whose gradient was added to the parameters' (`UpdateJobs.add_posted_into`)."""
        host, a = self.host, self.host.recipe.algorithm
        if part is not None:
            part.merge_into(self.acc, self.totals)
        scale = self.normaliser()
        try:
            for p in host.params:
                if p.grad is None:  # a step with no signal still takes its (zero-gradient) step
                    p.grad = torch.zeros_like(p)
                elif scale != 1.0:
                    p.grad.div_(scale)
            clip = a.grad_clip if a.grad_clip is not None else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(host.params, clip))
            host.optimizer.step()
            host.scheduler.step()
        finally:
            host.optimizer.zero_grad(set_to_none=True)
        for k in SUMMED:
            if k in self.acc.sums:
                self.acc.sums[k] = [v / scale for v in self.acc.sums[k]]
        return host._update_metrics(
            self.kept, self.acc, 1, [grad_norm], adv_abs_mean=self.adv_abs_sum / max(self.tokens, 1.0),
            tokens=self.tokens, trained_on_infra=self.trained_on_infra, rows_with_signal=self.rows_with_signal,
            totals=self.totals if self.correction is not None else None)

    def abort(self) -> None:
        self.host.optimizer.zero_grad(set_to_none=True)


@dataclass
class UpdatePart:
    """The metrics of the jobs the generator ran in one step (sent on the results queue with their step)."""

    step: int
    jobs: int = 0
    rows: int = 0
    seconds: float = 0.0
    acc: MicroTotals = field(default_factory=MicroTotals)
    totals: CorrectionTotals = field(default_factory=CorrectionTotals)

    def merge_into(self, acc: MicroTotals, totals: CorrectionTotals) -> None:
        for k, v in self.acc.sums.items():
            acc.sums.setdefault(k, []).extend(v)
        acc.ent_sum += self.acc.ent_sum
        acc.ent_tokens += self.acc.ent_tokens
        for f in fields(self.totals):
            setattr(totals, f.name, getattr(totals, f.name) + getattr(self.totals, f.name))
