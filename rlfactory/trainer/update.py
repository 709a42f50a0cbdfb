"""The GRPO update of the local engine (both loops): advantages, then micro-batched forward/backward and an optimizer
step, with the asynchronous loop's off-policy correction.

`GRPOUpdate` is a base of `LocalTrainer` (loop.py), which holds what it uses: `recipe`, `model`, `params`,
`optimizer`, `scheduler`, `ref_model` (None, a frozen copy, or "adapter-disabled"), `actor_cfg`, `tokenizer`,
`device`.

The update runs forward/backward only on trajectories whose advantage is non-zero (groups where every sample got
the same reward add exactly zero policy gradient), normalised over the whole mini-batch as verl does, so the
gradient is the one of the full batch at a fraction of the cost; with an entropy bonus or KL every row is computed.
Micro-batches group rows of similar length (`micro_batches.length_buckets`), and each distinct prompt of a
micro-batch goes through the model once (`algorithm.shared_prompt_forward`).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from rlfactory.algorithms.grpo import (
    build_batch,
    compute_advantages,
    exclude_infra_failures,
    policy_loss,
    prompt_groups,
    response_logprobs,
    set_global_batch,
    trained_on_infra_failures,
)
from rlfactory.algorithms.off_policy import CorrectionTotals, correct
from rlfactory.models.loading import pad_id_of
from rlfactory.trainer.checkpoint import is_peft
from rlfactory.trainer.micro_batches import length_buckets


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


SUMMED = ("loss/pg", "loss/total", "loss/kl")
"""Micro-batch metrics that are pieces of the mini-batch loss (summed); the others are averaged."""


@dataclass
class MicroTotals:
    """What the micro-batches of one update add up: loss metrics, and the entropy's token sum."""

    sums: dict[str, list[float]] = field(default_factory=dict)
    ent_sum: float = 0.0
    ent_tokens: float = 0.0


class GRPOUpdate:
    """The update step; see the module docstring for the attributes its host provides."""

    def _reference(self) -> Any:
        """The frozen reference for the KL term (None without one)."""
        kl = self.recipe.algorithm.kl
        if not (kl.use_reference and kl.coef > 0):
            return None

        if is_peft(self.model):
            return "adapter-disabled"  # the base weights under the adapter are the frozen reference

        ref = copy.deepcopy(self.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _update(self, trajs: list[Any], correction: Any = None) -> dict[str, float]:
        """GRPO advantages, then ppo_epochs x mini-batches of micro-batched forward/backward and an optimizer step.
        `correction` (an `OffPolicyConfig`, asynchronous runs): weight and mask tokens by pi_old / mu
        (algorithms/off_policy.py); None = the PPO ratio against the behaviour logprobs, as a synchronous step."""
        r = self.recipe
        a = r.algorithm
        hit = [t.infra_failed for t in trajs]
        trajs = exclude_infra_failures(trajs)  # out of the loss and of their groups' statistics
        batch = build_batch(trajs, pad_id_of(self.tokenizer))  # [N, ...] on CPU
        trained_on_infra = trained_on_infra_failures(hit, batch)
        if correction is not None and correction.is_cap is None and correction.mask_outside is None:
            correction = None
        totals = CorrectionTotals()
        # pi_old: the current weights. One update per step: the training forward pass gives it (detached), free;
        # several, or masking (which must know its mask before the loss is normalised): a no-grad pass first.
        proximal = weights = None
        if correction is not None and (a.ppo_epochs * a.mini_batches_per_step > 1 or correction.mask_outside):
            proximal = self._proximal_logprobs(batch, r.rollout.sampling.temperature)
            weights, batch.response_mask = correct(correction, proximal, batch.old_log_probs, batch.response_mask,
                                                   totals)
        advantages = compute_advantages(batch, norm_adv_by_std=a.norm_adv_by_std)  # [N, T]
        n = len(batch)
        mini = n // a.mini_batches_per_step
        only_signal = self._only_signal_rows()
        has_signal, lengths, prompt_of = self._row_plan(batch, advantages)
        acc = MicroTotals()
        grad_norms: list[float] = []
        self.model.train()
        try:
            for _epoch in range(a.ppo_epochs):
                for m0 in range(0, n, mini):
                    rows = list(range(m0, min(m0 + mini, n)))
                    set_global_batch(self.actor_cfg, batch.select(rows))  # normalise by the whole mini-batch
                    self.optimizer.zero_grad(set_to_none=True)
                    if only_signal:
                        # Rows with zero advantage add exactly zero policy gradient (no entropy bonus, no KL): skip
                        # their forward/backward. The normalisation above still counts them, so the gradient is
                        # the same as computing every row; pg metrics then cover the rows with signal.
                        rows = [i for i in rows if has_signal[i]]
                    for micro in length_buckets(rows, lengths, a.micro_batch_size, prompt_of):
                        self._micro_backward(batch, advantages, micro, correction, proximal, weights, totals, acc)
                    for p in self.params:  # a mini-batch with no signal still takes its (zero-gradient) step
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                    clip = a.grad_clip if a.grad_clip is not None else float("inf")
                    gn = torch.nn.utils.clip_grad_norm_(self.params, clip)
                    grad_norms.append(float(gn))
                    self.optimizer.step()
                    self.scheduler.step()
        finally:
            self.model.eval()
            self.optimizer.zero_grad(set_to_none=True)
        # Micro-batch losses are pieces of the mini-batch loss (global-batch normalisation): sum within a
        # mini-batch, average over mini-batches and epochs.
        updates = max(1, a.ppo_epochs * math.ceil(n / mini))
        mask = batch.response_mask
        return self._update_metrics(
            trajs, acc, updates, grad_norms,
            adv_abs_mean=float((advantages.abs() * mask).sum() / mask.sum().clamp(min=1)), tokens=float(mask.sum()),
            trained_on_infra=trained_on_infra, rows_with_signal=sum(has_signal),
            totals=totals if correction is not None else None)

    def _only_signal_rows(self) -> bool:
        """Whether rows with zero advantage may be skipped: they add exactly zero gradient (no entropy bonus, no
        KL). The loss normalisation still counts them."""
        return self.recipe.algorithm.entropy_coef == 0 and self.ref_model is None

    def _row_plan(self, batch: Any, advantages: torch.Tensor) -> tuple[list[bool], list[tuple[int, int]],
                                                                        list[int] | None]:
        """Per row of `batch`: whether it has signal, its real (prompt, response) lengths, and (with the shared
        prompt forward) the index of its distinct prompt; what `length_buckets` cuts micro-batches by."""
        has_signal = (advantages != 0).any(-1).tolist()  # [N]
        p_len = batch.prompt_len
        lengths = list(zip(batch.attention_mask[:, :p_len].sum(-1).tolist(),
                           batch.attention_mask[:, p_len:].sum(-1).tolist()))
        prompt_of = prompt_groups(batch)[1].tolist() if self.recipe.algorithm.shared_prompt_forward else None
        return has_signal, lengths, prompt_of

    def _micro_backward(self, batch: Any, advantages: torch.Tensor, micro: list[int], correction: Any,
                        proximal: torch.Tensor | None, weights: torch.Tensor | None, totals: CorrectionTotals,
                        acc: "MicroTotals") -> None:
        """Forward/backward of rows `micro` of `batch`, adding to the parameters' gradients and to `acc`. Without
        `proximal` and with a correction, pi_old is this pass's own logprobs (detached)."""
        a = self.recipe.algorithm
        temperature = self.recipe.rollout.sampling.temperature
        share = a.shared_prompt_forward
        mb = batch.select(micro).compact().to(self.device)
        adv = advantages[micro][:, :mb.responses.shape[1]].to(self.device)
        logp, ent = response_logprobs(self.model, mb, temperature=temperature, with_entropy=True,
                                      entropy_grad=a.entropy_coef != 0, share_prompts=share)
        ref = self._ref_logprobs(mb, temperature)
        old, w = mb.old_log_probs, None
        if correction is not None:
            t_len = mb.responses.shape[1]
            if proximal is None:
                old = logp.detach()
                w, _ = correct(correction, old, mb.old_log_probs, mb.response_mask, totals)
            else:
                old = proximal[micro][:, :t_len].to(self.device)
                w = None if weights is None else weights[micro][:, :t_len].to(self.device)
        loss, m = policy_loss(self.actor_cfg, log_prob=logp, old_log_prob=old,
                              advantages=adv, response_mask=mb.response_mask, entropy=ent,
                              ref_log_prob=ref, rollout_is_weights=w)
        loss.backward()
        for k, v in m.items():
            acc.sums.setdefault(k, []).append(v)
        if ent is not None:  # token-mean entropy over the rows computed (a metric)
            acc.ent_sum += float((ent.detach() * mb.response_mask).sum())
            acc.ent_tokens += float(mb.response_mask.sum())

    def _update_metrics(self, trajs: list[Any], acc: "MicroTotals", updates: int, grad_norms: list[float], *,
                        adv_abs_mean: float, tokens: float, trained_on_infra: int, rows_with_signal: int,
                        totals: CorrectionTotals | None) -> dict[str, float]:
        out = {k: sum(v) / updates if k in SUMMED else _mean(v) for k, v in acc.sums.items()}
        out["loss/entropy"] = acc.ent_sum / acc.ent_tokens if acc.ent_tokens else 0.0
        for k in ("loss/pg", "loss/total", "loss/pg_clipfrac", "loss/ppo_kl", "loss/pg_clipfrac_lower"):
            out.setdefault(k, 0.0)  # a step with no signal trains nothing: keep every row's keys the same
        out["loss/grad_norm"] = _mean(grad_norms)
        out["loss/lr"] = self.scheduler.get_last_lr()[0]
        out["rollout/advantage_abs_mean"] = adv_abs_mean
        groups: dict[Any, list[float]] = {}
        for t in trajs:
            groups.setdefault(t.group_id, []).append(t.reward or 0.0)
        out["rollout/groups_all_same_reward"] = float(sum(1 for v in groups.values() if max(v) == min(v)))
        out["rollout/trained_tokens"] = float(tokens)
        out["rollout/trained_on_infra_failures"] = float(trained_on_infra)
        out["rollout/rows_with_signal"] = float(rows_with_signal)
        if totals is not None:
            out.update(totals.metrics())
        return out

    def _proximal_logprobs(self, batch: Any, temperature: float) -> torch.Tensor:
        """Logprobs of every response token under the current weights, no gradient: [N, T] on CPU."""
        a = self.recipe.algorithm
        out = torch.zeros_like(batch.old_log_probs)
        with torch.no_grad():
            for u0 in range(0, len(batch), a.micro_batch_size):
                rows = list(range(u0, min(u0 + a.micro_batch_size, len(batch))))
                mb = batch.select(rows).compact().to(self.device)
                logp, _ = response_logprobs(self.model, mb, temperature=temperature,
                                            share_prompts=a.shared_prompt_forward)
                out[rows, :logp.shape[1]] = logp.float().cpu()
        return out

    def _ref_logprobs(self, mb: Any, temperature: float) -> Any:
        if self.ref_model is None:
            return None
        share = self.recipe.algorithm.shared_prompt_forward
        with torch.no_grad():
            if self.ref_model == "adapter-disabled":
                with self.model.disable_adapter():
                    return response_logprobs(self.model, mb, temperature=temperature, share_prompts=share)[0]
            return response_logprobs(self.ref_model, mb, temperature=temperature, share_prompts=share)[0]
