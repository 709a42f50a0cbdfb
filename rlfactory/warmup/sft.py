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
from rlfactory.models.vision import VisionProcessor, mrope_positions, save_tokenizer
from rlfactory.recipe.sft import SFTPhase
from rlfactory.rollout.images import message_content, tool_content
from rlfactory.tools.images import ImageLimits, decode_image
from rlfactory.tools.types import ToolImage

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------ encoding
Example = tuple[list[int], list[int]] | tuple[list[int], list[int], list[ToolImage]]
"""(token ids, loss mask) of one transcript, and its images in token order when it has any."""


def encode_transcript(chat: Any, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one transcript without images (`encode_example` takes any)."""
    ids, mask, images = encode_example(chat, messages)
    if images:
        raise ValueError("the transcript holds images: encode it with encode_example")
    return ids, mask


def _tool_message(chat: Any, content: Any) -> tuple[dict[str, Any], list[ToolImage]]:
    """A demonstration's tool message as the AgentLoop builds it from a result (text, then the images the policy is
    shown; a note for each it cannot be), and those images. Image parts are checked as a tool's images are."""
    if isinstance(content, str) or content is None:
        return {"role": "tool", "content": content or ""}, []
    text = "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    images = [decode_image(p.get("data_b64", ""), str(p.get("mime_type", "")), ImageLimits())
              for p in content if p.get("type") == "image"]
    seen, shown = tool_content(chat, text, images)
    return {"role": "tool", "content": message_content(seen, shown)}, shown


def encode_example(chat: Any, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[int], list[ToolImage]]:
    """(token ids, loss mask, images) of one transcript, built the way the AgentLoop builds a trajectory.

    `chat` is a `ChatFormat` (tokenizer, tools, thinking switch). Messages before the first assistant turn are the
    prompt (a system message in them replaces the ChatFormat's system prompt). A tool message's content is its text,
    or parts (`{"type": "text"}`, `{"type": "image", "data_b64", "mime_type"}`): a VL policy's images are expanded
    to their placeholder tokens (mask 0) and returned in order; a text-only policy reads a note instead.
    """
    all_images: list[ToolImage] = []
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
        group, images = [], []
        while i < len(messages) and messages[i]["role"] == "tool":
            message, shown = _tool_message(chat, messages[i]["content"])
            group.append(message)
            images += shown
            i += 1
        if not group:
            raise ValueError(f"unexpected {m['role']!r} message after the prompt (only assistant and tool turns)")
        if i >= len(messages):
            break  # a transcript ending on a tool turn: nothing after it to learn
        delta = chat.tool_response_delta(group, images=images)
        ids += delta
        mask += [0] * len(delta)
        all_images += images
    return ids, mask, all_images


# ------------------------------------------------------------------------------------------------------ training
def policy_turns(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each policy turn of an encoded transcript: each run of mask 1s, its end token included."""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and i and mask[i - 1]:
            spans[-1] = (spans[-1][0], i + 1)
        elif m:
            spans.append((i, i + 1))
    return spans


def _batch(examples: Sequence[Example], pad_id: int) -> tuple[Any, Any, Any]:
    width = max(len(e[0]) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    labels = torch.full((len(examples), width), -100, dtype=torch.long)  # [B, T]
    for row, (ids, mask, *_images) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
    return input_ids, attention, labels


def _pixel_inputs(examples: Sequence[Example], width: int, vision: VisionProcessor | None) -> dict[str, Any]:
    """A VL policy's extra inputs for a batch whose rows hold images: pixels, grids and positions [4, B, T] (plain
    positions, then mRoPE), as the update passes them (algorithms/pixels.py); empty when no row has images."""
    rows = [list(e[2]) if len(e) > 2 else [] for e in examples]  # type: ignore[misc]
    if not any(rows):
        return {}
    if vision is None:
        raise ValueError("the demonstrations hold images but the policy has no image processor (a text-only model "
                         "cannot be trained on them; set sft.scratch_model.vision or start from a VL model)")
    plain = torch.arange(width).unsqueeze(0).repeat(len(examples), 1)  # [B, T] (right padding)
    mrope = plain.unsqueeze(0).repeat(3, 1, 1)  # [3, B, T]
    for row, (example, images) in enumerate(zip(examples, rows)):
        if images:
            ids = example[0]
            mrope[:, row, :len(ids)] = mrope_positions(ids, [vision.grid(im) for im in images],
                                                       vision.image_token_id, vision.merge_size)
    pixels, grids = vision.pixel_inputs([im for images in rows for im in images])
    return {"position_ids": torch.cat([plain.unsqueeze(0), mrope]), "pixel_values": pixels, "image_grid_thw": grids}


def policy_token_loss(model: Any, input_ids: Any, attention: Any, labels: Any, **extra: Any) -> tuple[Any, int]:
    """Mean next-token cross-entropy over policy tokens; returns (loss, number of policy tokens). `extra`: a VL
    policy's pixel inputs and positions (`_pixel_inputs`)."""
    with autocast(model):  # model.compute_dtype (models/precision.py)
        logits = model(input_ids=input_ids, attention_mask=attention, **extra).logits[:, :-1]  # [B, T-1, V]
    target = labels[:, 1:]  # [B, T-1]
    n = int((target != -100).sum())
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss / max(n, 1), n


def train_phases(
    model: Any,
    phases: Sequence[tuple[SFTPhase, Sequence[Example]]],
    *,
    batch_size: int,
    pad_id: int,
    grad_clip: float | None = 1.0,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    seed: int = 0,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    vision: VisionProcessor | None = None,
) -> list[dict[str, Any]]:
    """Run the phases in order (a fresh AdamW per phase, linear warm-up then a constant rate); returns one metrics
    dict per step (`phase`, `step`, `loss`, `lr`, `grad_norm`, `tokens`, `time_s`). `vision`: a VL policy's image
    processor, for examples with images."""
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
            tensors = _batch(picked, pad_id)
            extra = {k: v.to(device) for k, v in _pixel_inputs(picked, tensors[0].shape[1], vision).items()}
            loss, n_tokens = policy_token_loss(model, *(t.to(device) for t in tensors), **extra)
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
    """Save an HF model folder: config, safetensors weights in `dtype`, tokenizer and chat template (and a VL
    policy's image processor settings, preprocessor_config.json)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Cast a copy so the caller's float32 training weights stay as they are.
    to_save = copy.deepcopy(model).to(device="cpu", dtype=getattr(torch, dtype))
    to_save.config.dtype = dtype
    to_save.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(tokenizer, out)
    return out
