"""Supervised warm-up (SFT) on transcripts: the `sft:` section of a recipe, the token/mask encoding, the loop.

The loss is on policy tokens only. A transcript is encoded exactly the way the AgentLoop builds a trajectory
(`rlfactory.rollout.chat.ChatFormat`): the prompt is the template's rendering of the system and user turns with the
generation prompt; each assistant turn is its text's tokens plus `<|im_end|>` (mask 1); each tool turn is the token
delta the template puts after an assistant turn (mask 0). So what SFT teaches is token for token what GRPO samples.

What is here: config, encoding, batching, the optimisation loop (AdamW, linear warm-up, grad clipping, phases) and
saving an HF model folder. What is not: making demonstrations (`demos.py`), building a tokenizer
(`tokenizer_builder.py`), the end-to-end command with its usable-start check (`run.py`, `check.py`). The `sft:`
section itself is rlfactory/recipe/sft.py.
"""
from __future__ import annotations

import copy
import logging
import math
import random
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from rlfactory.models.precision import autocast
from rlfactory.recipe.sft import SFTPhase

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------ encoding
def encode_transcript(chat: Any, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one transcript, built the way the AgentLoop builds a trajectory.

    `chat` is a `ChatFormat` (tokenizer, tools, thinking switch). Messages before the first assistant turn are the
    prompt (a system message in them replaces the ChatFormat's system prompt).
    """
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("a transcript needs at least one assistant message")
    prompt = [{"role": m["role"], "content": m["content"]} for m in messages[:first]]
    ids = chat.prompt_ids(chat.prompt_messages(prompt))
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        m = messages[i]
        if m["role"] == "assistant":
            turn = chat.encode(m["content"] or "") + [chat.im_end_id]
            ids += turn
            mask += [1] * len(turn)
            i += 1
            continue
        group = []
        while i < len(messages) and messages[i]["role"] == "tool":
            group.append({"role": "tool", "content": messages[i]["content"]})
            i += 1
        if not group:
            raise ValueError(f"unexpected {m['role']!r} message after the prompt (only assistant and tool turns)")
        if i >= len(messages):
            break  # a transcript ending on a tool turn: nothing after it to learn
        delta = chat.tool_response_delta(group)
        ids += delta
        mask += [0] * len(delta)
    return ids, mask


# ------------------------------------------------------------------------------------------------------ training
def _batch(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    labels = torch.full((len(examples), width), -100, dtype=torch.long)  # [B, T]
    for row, (ids, mask) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
    return input_ids, attention, labels


def policy_token_loss(model: Any, input_ids: Any, attention: Any, labels: Any) -> tuple[Any, int]:
    """Mean next-token cross-entropy over policy tokens; returns (loss, number of policy tokens)."""
    with autocast(model):  # model.compute_dtype (models/precision.py)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]  # [B, T-1, V]
    target = labels[:, 1:]  # [B, T-1]
    n = int((target != -100).sum())
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss / max(n, 1), n


def train_phases(
    model: Any,
    phases: Sequence[tuple[SFTPhase, Sequence[tuple[list[int], list[int]]]]],
    *,
    batch_size: int,
    pad_id: int,
    grad_clip: float | None = 1.0,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    seed: int = 0,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the phases in order (a fresh AdamW per phase, linear warm-up then a constant rate); returns one metrics
    dict per step (`phase`, `step`, `loss`, `lr`, `grad_norm`, `tokens`, `time_s`)."""
    rng = random.Random(seed)
    device = next(model.parameters()).device  # batches go where the model is
    history: list[dict[str, Any]] = []
    model.train()
    step = 0
    for phase_index, (phase, examples) in enumerate(phases):
        if not examples:
            raise ValueError(f"sft phase {phase_index} ({phase.data}) has no examples")
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=phase.lr, betas=betas, weight_decay=weight_decay)
        order: list[int] = []
        for k in range(phase.steps):
            lr = phase.lr * min(1.0, (k + 1) / phase.warmup_steps) if phase.warmup_steps else phase.lr
            for g in opt.param_groups:
                g["lr"] = lr
            picked = []
            while len(picked) < batch_size:
                if not order:  # epochs over the phase's data, reshuffled each time
                    order = list(range(len(examples)))
                    rng.shuffle(order)
                picked.append(examples[order.pop()])
            t0 = time.perf_counter()
            loss, n_tokens = policy_token_loss(model, *(t.to(device) for t in _batch(picked, pad_id)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else math.inf)
            opt.step()
            step += 1
            row = {"phase": phase_index, "step": step, "loss": float(loss.detach()), "lr": lr, "grad_norm": float(norm),
                   "tokens": n_tokens, "time_s": time.perf_counter() - t0}
            history.append(row)
            if on_step:
                on_step(row)
    model.eval()
    return history


def save_model(model: Any, tokenizer: Any, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """Save an HF model folder: config, safetensors weights in `dtype`, tokenizer and chat template."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Cast a copy so the caller's float32 training weights stay as they are.
    to_save = copy.deepcopy(model).to(device="cpu", dtype=getattr(torch, dtype))
    to_save.config.dtype = dtype
    to_save.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out
