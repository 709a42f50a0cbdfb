"""The GRPO update of the local engine (`Update`), one for both loops: a batch prepared once (`prepare`), micro-batched
forward/backward (`backward`), and one optimizer step (`optimizer_step`). `whole_batch` is the synchronous step's
update (and the asynchronous one's when its step cannot be built as groups arrive); the asynchronous loop's streamed
step (asynchronous/streamed.py) calls the same three methods as its groups arrive.

Forward/backward runs only on trajectories whose advantage is non-zero (groups where every sample got the same reward
add exactly zero policy gradient), normalised over the whole mini-batch as verl does, so the gradient is the one of
the full batch at a fraction of the cost; with an entropy bonus or KL every row is computed. Micro-batches group rows
of similar length (`micro_batches.length_buckets`), and each distinct prompt of a micro-batch goes through the model
once (`algorithm.shared_prompt_forward`). With an off-policy correction (asynchronous runs) tokens are weighted or
masked by pi_old / mu (algorithms/off_policy.py).

Left out: the loops, checkpoints, the policy's loading (policy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rlfactory.algorithms import credit
from rlfactory.algorithms.branch_credit import train_prefix_once
from rlfactory.algorithms.grpo import (
    GRPOBatch,
    build_batch,
    exclude_infra_failures,
    policy_loss,
    prompt_groups,
    response_logprobs,
    set_global_batch,
    trained_on_infra_failures,
)
from rlfactory.algorithms.off_policy import CorrectionTotals, correct
from rlfactory.algorithms.turn_credit import company_fraction
from rlfactory.models.loading import pad_id_of
from rlfactory.models.vision import vision_of
from rlfactory.recipe.training import OffPolicyConfig
from rlfactory.rollout.trajectory import Trajectory, groups_of
from rlfactory.trainer.micro_batches import length_buckets
from rlfactory.trainer.policy import Policy
from rlfactory.trainer.settled import scored_alike

SUMMED = ("loss/pg", "loss/total", "loss/kl")
"""Micro-batch metrics that are pieces of the mini-batch loss (summed); the others are averaged."""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


@dataclass
class MicroTotals:
    """What the micro-batches of one update add up: loss metrics, and the entropy's token sum."""

    sums: dict[str, list[float]] = field(default_factory=dict)
    ent_sum: float = 0.0
    ent_tokens: float = 0.0


@dataclass
class Prepared:
    """Trajectories as one batch ready for forward/backward: padded tensors, advantages, and per row whether it has
    signal, its real (prompt, response) lengths and (with the shared prompt forward) its distinct prompt's index."""

    batch: GRPOBatch
    advantages: torch.Tensor  # [N, T]
    kept: list[Trajectory]
    """The trajectories in batch order (infrastructure failures masked out, in groups of their own)."""
    has_signal: list[bool]  # [N]
    lengths: list[tuple[int, int]]  # [N]
    prompt_of: list[int] | None  # [N]
    trained_on_infra: int
    """Infrastructure failures that still have a trained token (0 unless something is wrong)."""

    @property
    def tokens(self) -> float:
        return float(self.batch.response_mask.sum())

    @property
    def sequences(self) -> float:
        return float((self.batch.response_mask.sum(-1) > 0).sum())

    @property
    def adv_abs_sum(self) -> float:
        return float((self.advantages.abs() * self.batch.response_mask).sum())


@dataclass
class Correction:
    """An off-policy correction's state for one update: the recipe's settings, the proximal (pi_old) logprobs and
    weights when computed ahead, and the totals its metrics report."""

    config: OffPolicyConfig | None
    proximal: torch.Tensor | None = None  # [N, T]
    weights: torch.Tensor | None = None  # [N, T]
    totals: CorrectionTotals = field(default_factory=CorrectionTotals)


class Update:
    """The update step over a `Policy`."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.recipe = policy.recipe

    # ------------------------------------------------------------------------------------------- building blocks
    def prepare(self, trajs: list[Trajectory]) -> Prepared:
        """The batch, advantages and row plan of scored trajectories (infrastructure failures out of the loss and of
        their groups' statistics)."""
        hit = [t.infra_failed for t in trajs]
        kept = train_prefix_once(exclude_infra_failures(trajs))
        batch = build_batch(kept, pad_id_of(self.policy.tokenizer), vision_of(self.policy.tokenizer))  # [N, ...] CPU
        advantages = credit.advantages(kept, batch, self.recipe.algorithm)  # [N, T]
        has_signal = (advantages != 0).any(-1).tolist()  # [N]
        p_len = batch.prompt_len
        lengths = list(zip(batch.attention_mask[:, :p_len].sum(-1).tolist(),
                           batch.attention_mask[:, p_len:].sum(-1).tolist()))
        prompt_of = prompt_groups(batch)[1].tolist() if self.recipe.algorithm.shared_prompt_forward else None
        return Prepared(batch, advantages, kept, has_signal, lengths, prompt_of,
                        trained_on_infra_failures(hit, batch))

    def only_signal_rows(self) -> bool:
        """Whether rows with zero advantage may be skipped: they add exactly zero gradient (no entropy bonus, no KL).
        The loss normalisation still counts them."""
        return self.recipe.algorithm.entropy_coef == 0 and self.policy.reference is None

    def micro_batches(self, prep: Prepared, rows: list[int]) -> list[list[int]]:
        """`rows` of `prep` cut into micro-batches (`length_buckets`), without the rows that cannot add gradient."""
        if self.only_signal_rows():
            rows = [i for i in rows if prep.has_signal[i]]
        return length_buckets(rows, prep.lengths, self.recipe.algorithm.micro_batch_size, prep.prompt_of)

    def normalise_by(self, mini_batch: GRPOBatch | None) -> None:
        """Normalise the next micro-batch losses by `mini_batch` (its tokens and sequences), as verl's actor does; None:
        by 1, a plain sum, which the caller divides once every micro-batch is in (`optimizer_step(scale)`)."""
        cfg = self.policy.actor_cfg
        if mini_batch is not None:
            set_global_batch(cfg, mini_batch)
        else:
            cfg.global_batch_info.update(dp_size=1, batch_num_tokens=1.0, global_batch_size=1.0,
                                         loss_scale_factor=cfg.loss_scale_factor)

    def loss_normaliser(self, tokens: float, sequences: float) -> float:
        """What a summed loss is divided by: the response tokens (`token-mean`) or sequences (`seq-mean-*`)."""
        mode = self.policy.actor_cfg.loss_agg_mode
        if mode == "token-mean":
            return max(tokens, 1.0)
        if mode.startswith("seq-mean"):
            return max(sequences, 1.0)
        return 1.0  # token-sum

    def backward(self, prep: Prepared, micro: list[int], correction: Correction, acc: MicroTotals) -> None:
        """Forward/backward of rows `micro` of `prep`, adding to the parameters' gradients and to `acc`. With a
        correction and no proximal logprobs computed ahead, pi_old is this pass's own logprobs (detached)."""
        a, pol = self.recipe.algorithm, self.policy
        temperature = self.recipe.rollout.sampling.temperature
        mb = prep.batch.select(micro).compact().to(pol.device)
        t_len = mb.responses.shape[1]
        adv = prep.advantages[micro][:, :t_len].to(pol.device)
        pol.model.train()
        try:
            logp, ent = response_logprobs(pol.model, mb, temperature=temperature, with_entropy=True,
                                          entropy_grad=a.entropy_coef != 0, share_prompts=a.shared_prompt_forward)
            ref = self._ref_logprobs(mb, temperature)
            old, w = mb.old_log_probs, None
            if correction.config is not None:
                if correction.proximal is None:
                    old = logp.detach()
                    w, _ = correct(correction.config, old, mb.old_log_probs, mb.response_mask, correction.totals)
                else:
                    old = correction.proximal[micro][:, :t_len].to(pol.device)
                    w = None if correction.weights is None else correction.weights[micro][:, :t_len].to(pol.device)
            loss, m = policy_loss(pol.actor_cfg, log_prob=logp, old_log_prob=old, advantages=adv,
                                  response_mask=mb.response_mask, entropy=ent, ref_log_prob=ref,
                                  rollout_is_weights=w)
            loss.backward()
        finally:
            pol.model.eval()
        for k, v in m.items():
            acc.sums.setdefault(k, []).append(v)
        if ent is not None:  # token-mean entropy over the rows computed (a metric)
            acc.ent_sum += float((ent.detach() * mb.response_mask).sum())
            acc.ent_tokens += float(mb.response_mask.sum())

    def optimizer_step(self, scale: float = 1.0) -> float:
        """Divide the gradients by `scale`, clip, step the optimizer and the schedule, clear the gradients; the
        gradient norm before clipping. A step with no signal still takes its (zero-gradient) step."""
        pol, a = self.policy, self.recipe.algorithm
        try:
            for p in pol.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                elif scale != 1.0:
                    p.grad.div_(scale)
            clip = a.grad_clip if a.grad_clip is not None else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(pol.params, clip))
            pol.optimizer.step()
            pol.scheduler.step()
        finally:
            pol.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def metrics(self, kept: list[Trajectory], acc: MicroTotals, updates: int, grad_norms: list[float], *,
                adv_abs_mean: float, tokens: float, trained_on_infra: int, rows_with_signal: int,
                totals: CorrectionTotals | None) -> dict[str, float]:
        """The update's metrics row part. Micro-batch losses are pieces of the mini-batch loss: summed within a
        mini-batch, averaged over `updates` (mini-batches x epochs)."""
        out = {k: sum(v) / updates if k in SUMMED else _mean(v) for k, v in acc.sums.items()}
        out["loss/entropy"] = acc.ent_sum / acc.ent_tokens if acc.ent_tokens else 0.0
        for k in ("loss/pg", "loss/total", "loss/pg_clipfrac", "loss/ppo_kl", "loss/pg_clipfrac_lower"):
            out.setdefault(k, 0.0)  # a step with no signal trains nothing: keep every row's keys the same
        out["loss/grad_norm"] = _mean(grad_norms)
        out["loss/lr"] = self.policy.scheduler.get_last_lr()[0]
        out["rollout/advantage_abs_mean"] = adv_abs_mean
        out["rollout/groups_all_same_reward"] = float(sum(
            1 for g in groups_of(kept).values() if scored_alike(g, as_trained=True)))
        out["rollout/trained_tokens"] = float(tokens)
        out["rollout/trained_on_infra_failures"] = float(trained_on_infra)
        out["rollout/rows_with_signal"] = float(rows_with_signal)
        if self.recipe.algorithm.turn_credit.estimator != "none":
            out["credit/turns_with_company"] = company_fraction(kept, self.recipe.algorithm.turn_credit)
        if totals is not None:
            out.update(totals.metrics())
        return out

    # ------------------------------------------------------------------------------------------- the whole batch
    def whole_batch(self, trajs: list[Trajectory], off_policy: OffPolicyConfig | None = None) -> dict[str, float]:
        """GRPO advantages, then ppo_epochs x mini-batches of micro-batched forward/backward and an optimizer step.
        `off_policy` (asynchronous runs): weight and mask tokens by pi_old / mu; None = the PPO ratio against the
        behaviour logprobs, as a synchronous step."""
        a = self.recipe.algorithm
        prep = self.prepare(trajs)
        batch = prep.batch
        if off_policy is not None and off_policy.is_cap is None and off_policy.mask_outside is None:
            off_policy = None
        corr = Correction(off_policy)
        # pi_old: the current weights. One update per step: the training forward pass gives it (detached), free;
        # several, or masking (which must know its mask before the loss is normalised): a no-grad pass first.
        if off_policy is not None and (a.ppo_epochs * a.mini_batches_per_step > 1 or off_policy.mask_outside):
            corr.proximal = self.proximal_logprobs(batch)
            corr.weights, batch.response_mask = correct(off_policy, corr.proximal, batch.old_log_probs,
                                                        batch.response_mask, corr.totals)
            prep.advantages = prep.advantages * batch.response_mask  # masked tokens carry no advantage either
            prep.has_signal = (prep.advantages != 0).any(-1).tolist()
        n = len(batch)
        mini = n // a.mini_batches_per_step
        acc = MicroTotals()
        grad_norms: list[float] = []
        for _epoch in range(a.ppo_epochs):
            for m0 in range(0, n, mini):
                rows = list(range(m0, min(m0 + mini, n)))
                self.normalise_by(batch.select(rows))  # the whole mini-batch, skipped rows included
                self.policy.optimizer.zero_grad(set_to_none=True)
                for micro in self.micro_batches(prep, rows):
                    self.backward(prep, micro, corr, acc)
                grad_norms.append(self.optimizer_step())
        mask = batch.response_mask
        return self.metrics(prep.kept, acc, max(1, a.ppo_epochs * math.ceil(n / mini)), grad_norms,
                            adv_abs_mean=float((prep.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
                            tokens=float(mask.sum()), trained_on_infra=prep.trained_on_infra,
                            rows_with_signal=sum(prep.has_signal),
                            totals=corr.totals if off_policy is not None else None)

    # ------------------------------------------------------------------------------------------- logprobs
    def proximal_logprobs(self, batch: GRPOBatch) -> torch.Tensor:
        """Logprobs of every response token under the current weights, no gradient: [N, T] on CPU."""
        a, pol = self.recipe.algorithm, self.policy
        out = torch.zeros_like(batch.old_log_probs)
        with torch.no_grad():
            for u0 in range(0, len(batch), a.micro_batch_size):
                rows = list(range(u0, min(u0 + a.micro_batch_size, len(batch))))
                mb = batch.select(rows).compact().to(pol.device)
                logp, _ = response_logprobs(pol.model, mb, temperature=self.recipe.rollout.sampling.temperature,
                                            share_prompts=a.shared_prompt_forward)
                out[rows, :logp.shape[1]] = logp.float().cpu()
        return out

    def _ref_logprobs(self, mb: GRPOBatch, temperature: float) -> torch.Tensor | None:
        ref, model = self.policy.reference, self.policy.model
        if ref is None:
            return None
        share = self.recipe.algorithm.shared_prompt_forward
        with torch.no_grad():
            if ref == "adapter-disabled":
                with model.disable_adapter():
                    return response_logprobs(model, mb, temperature=temperature, share_prompts=share)[0]
            return response_logprobs(ref, mb, temperature=temperature, share_prompts=share)[0]
