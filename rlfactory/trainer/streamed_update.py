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

Used for one mini-batch and one epoch per step without masking (`off_policy.mask_outside`), the defaults: masking
must know every token's fate before the loss is normalised, and several updates per step need the whole batch.
Otherwise the asynchronous loop waits for every group and calls `_update`.
"""
from __future__ import annotations

from typing import Any

import torch

from rlfactory.algorithms.grpo import build_batch, compute_advantages, exclude_infra_failures, trained_on_infra_failures
from rlfactory.algorithms.off_policy import CorrectionTotals
from rlfactory.models.loading import pad_id_of
from rlfactory.trainer.micro_batches import length_buckets
from rlfactory.trainer.update import SUMMED, MicroTotals


def streams(recipe: Any) -> bool:
    """Whether an asynchronous step of this recipe can be built group by group."""
    a = recipe.algorithm
    return a.ppo_epochs == 1 and a.mini_batches_per_step == 1 and a.off_policy.mask_outside is None


class StreamedStep:
    """`add(trajectories)` as groups arrive (forward/backward), then `finish()` (the optimizer step) -> metrics.
    `host` is the `GRPOUpdate` (the trainer)."""

    def __init__(self, host: Any, correction: Any):
        self.host = host
        self.correction = None if correction is None or correction.is_cap is None else correction
        self.totals = CorrectionTotals()
        self.acc = MicroTotals()
        self.kept: list[Any] = []
        self.tokens = self.sequences = self.adv_abs_sum = 0.0
        self.rows_with_signal = self.trained_on_infra = 0
        host.optimizer.zero_grad(set_to_none=True)

    def add(self, trajs: list[Any]) -> None:
        """Forward/backward of whole groups' trajectories (run in a worker thread)."""
        host, a = self.host, self.host.recipe.algorithm
        hit = [t.infra_failed for t in trajs]
        kept = exclude_infra_failures(trajs)  # out of the loss and of their groups' statistics
        if not kept:
            return
        self.kept += kept
        batch = build_batch(kept, pad_id_of(host.tokenizer))
        self.trained_on_infra += trained_on_infra_failures(hit, batch)
        advantages = compute_advantages(batch, norm_adv_by_std=a.norm_adv_by_std)
        mask = batch.response_mask
        self.tokens += float(mask.sum())
        self.sequences += float((mask.sum(-1) > 0).sum())
        self.adv_abs_sum += float((advantages.abs() * mask).sum())
        has_signal, lengths, prompt_of = host._row_plan(batch, advantages)
        self.rows_with_signal += sum(has_signal)
        rows = list(range(len(batch)))
        if host._only_signal_rows():
            rows = [i for i in rows if has_signal[i]]
        info = host.actor_cfg.global_batch_info
        info.update(dp_size=1, batch_num_tokens=1.0, global_batch_size=1.0,
                    loss_scale_factor=host.actor_cfg.loss_scale_factor)  # sums; divided in finish()
        host.model.train()
        try:
            for micro in length_buckets(rows, lengths, a.micro_batch_size, prompt_of):
                host._micro_backward(batch, advantages, micro, self.correction, None, None, self.totals, self.acc)
        finally:
            host.model.eval()

    def normaliser(self) -> float:
        mode = self.host.actor_cfg.loss_agg_mode
        if mode == "token-mean":
            return max(self.tokens, 1.0)
        if mode.startswith("seq-mean"):
            return max(self.sequences, 1.0)
        return 1.0  # token-sum

    def finish(self) -> dict[str, float]:
        """Normalise, clip and step; the step's metrics (the keys `_update` reports)."""
        host, a = self.host, self.host.recipe.algorithm
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
