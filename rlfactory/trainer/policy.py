"""`Policy`: what the local engine trains, loaded once from a recipe: the model (full or LoRA), its tokenizer and
device, the optimizer and learning-rate schedule over its trainable parameters, the frozen KL reference, and the
actor settings verl's losses read.

Both loops and `rlfactory eval` hold one. Left out: the update itself (update.py), checkpoints (checkpoint.py).
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from rlfactory.algorithms.grpo import actor_config
from rlfactory.models.devices import avoid_cudnn_attention, resolve_device
from rlfactory.models.loading import load_policy, load_tokenizer
from rlfactory.recipe.schema import Recipe
from rlfactory.trainer.checkpoint import is_peft

Reference = torch.nn.Module | Literal["adapter-disabled"] | None
"""The KL reference: a frozen copy, "adapter-disabled" (LoRA: the base weights under the adapter), or none."""


@dataclass
class Policy:
    recipe: Recipe
    model: Any
    tokenizer: Any
    device: torch.device
    params: list[torch.nn.Parameter]
    """The trainable parameters (all of them, or the adapter's)."""
    optimizer: torch.optim.Optimizer | None
    """None for a copy that only computes gradients (the generator's side of a shared update)."""
    scheduler: torch.optim.lr_scheduler.LambdaLR | None
    reference: Reference
    actor_cfg: Any
    """verl's `ActorConfig` for the losses (`grpo.actor_config`)."""

    @classmethod
    def load(cls, recipe: Recipe, *, model_path: str | Path | None = None, for_eval: bool = False) -> Policy:
        """Seed torch and Python's RNG from `trainer.seed`, then load. `model_path` replaces `model.path` (a
        checkpoint's model folder, for eval); `for_eval` skips the reference model."""
        r = recipe
        torch.set_num_threads(r.trainer.torch_threads)
        device = resolve_device(r.trainer.device)
        avoid_cudnn_attention(device)  # training batches change length every step too
        random.seed(r.trainer.seed)
        torch.manual_seed(r.trainer.seed)
        tokenizer = load_tokenizer(r, model_path)
        model = load_policy(r, device, model_path)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = r.algorithm.optimizer
        optimizer = torch.optim.AdamW(params, lr=r.algorithm.learning_rate, betas=tuple(opt.betas),
                                      weight_decay=opt.weight_decay, eps=opt.eps)
        warm = opt.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: min(1.0, (n + 1) / warm) if warm else 1.0)
        mini_prompts = r.trainer.prompts_per_step // r.algorithm.mini_batches_per_step
        actor_cfg = actor_config(r.algorithm, samples_per_prompt=r.rollout.samples_per_prompt,
                                 mini_batch_prompts=mini_prompts)
        reference = None if for_eval else _reference(r, model)
        return cls(r, model, tokenizer, device, params, optimizer, scheduler, reference, actor_cfg)

    def set_learning_rate(self, lr: float) -> None:
        """A new peak learning rate after a resume: the optimizer's and the schedule's, at the schedule's point."""
        self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        for g in self.optimizer.param_groups:
            g["initial_lr"], g["lr"] = lr, lr * factor


def _reference(recipe: Recipe, model: Any) -> Reference:
    kl = recipe.algorithm.kl
    if not (kl.use_reference and kl.coef > 0):
        return None
    if is_peft(model):
        return "adapter-disabled"  # the base weights under the adapter are the frozen reference
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
