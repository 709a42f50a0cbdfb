"""The images of a GRPO batch (`GRPOBatch.pixels`): what the update passes a vision-language policy so that its
logprobs are those the engine sampled under: the same pixels (the policy's `VisionProcessor`, as the HF engine uses
it) and the same multimodal rotary positions (`models/vision.py` `mrope_positions`, from the trajectory's ids and
image grids), with the image placeholder left out of the distribution as the engine's sampler leaves it out.

Rows are trajectories; an image is kept with its row through `select` (micro-batches), `columns` (compaction trims
padding only, never a real token) and `to` (device). Pixels are made per forward pass from the images (the
processor caches them by sha256), so a batch holds base64 images, not pixel tensors, between passes.
Left out: videos; sharing a prompt's forward pass across a group's rows (the prompt pass would need the images cut
between the two passes: VL batches run every row whole).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlfactory.models.vision import VisionProcessor, mrope_positions
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.tools.types import ToolImage

BANNED_LOGIT = -1e9
"""What the image placeholder's logit becomes (not -inf: the entropy's p * log p must stay 0, not NaN)."""


@dataclass
class PixelRows:
    images: list[list[ToolImage]]
    """Per row, its images in token order."""
    mrope: torch.Tensor
    """[3, N, P+T] mRoPE positions, aligned with the batch's columns (padding: the plain positions)."""
    vision: VisionProcessor

    @classmethod
    def build(cls, trajectories: list[Trajectory], position_ids: torch.Tensor, prompt_len: int,
              vision: VisionProcessor | None) -> "PixelRows | None":
        """The batch's images, or None when no trajectory has any. `position_ids` [N, P+T]: the plain positions."""
        if not any(t.images for t in trajectories):
            return None
        if vision is None:
            raise ValueError("build_batch: trajectories hold images, but no image processor was given (a text-only "
                             "policy cannot be trained on them; pass vision=vision_of(tokenizer))")
        mrope = position_ids.unsqueeze(0).repeat(3, 1, 1)
        for i, t in enumerate(trajectories):
            if not t.images:
                continue
            ids = t.prompt_ids + t.response_ids
            grids = [vision.grid(im) for im in t.images]
            start = prompt_len - len(t.prompt_ids)
            mrope[:, i, start:start + len(ids)] = mrope_positions(ids, grids, vision.image_token_id,
                                                                  vision.merge_size)
        return cls([list(t.images) for t in trajectories], mrope, vision)

    def select(self, idx: torch.Tensor) -> "PixelRows":
        return PixelRows([self.images[int(i)] for i in idx], self.mrope[:, idx], self.vision)

    def columns(self, cols: slice) -> "PixelRows":
        return PixelRows(self.images, self.mrope[:, :, cols], self.vision)

    def to(self, device: torch.device | str) -> "PixelRows":
        return PixelRows(self.images, self.mrope.to(device), self.vision)

    def model_inputs(self, position_ids: torch.Tensor) -> dict[str, Any]:
        """`position_ids` [4, N, L] (plain, then mRoPE) and, when the rows hold images, `pixel_values` and
        `image_grid_thw` in row then token order (how the model scatters image features)."""
        out: dict[str, Any] = {"position_ids": torch.cat([position_ids.unsqueeze(0), self.mrope], dim=0)}
        flat = [im for row in self.images for im in row]
        if flat:
            pixels, grid = self.vision.pixel_inputs(flat)
            out["pixel_values"], out["image_grid_thw"] = pixels.to(position_ids.device), grid.to(position_ids.device)
        return out

    def placeholder_bias(self, vocab: int, device: torch.device | str) -> torch.Tensor:
        """[V] zeros with `BANNED_LOGIT` at the image placeholder: the ban as a logit bias (the chunked LM head)."""
        bias = torch.zeros(vocab, device=device)
        bias[self.vision.image_token_id] = BANNED_LOGIT
        return bias

    def ban_placeholder(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [..., V] with the image placeholder's set to `BANNED_LOGIT` (the engine never samples it)."""
        ban = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        ban[self.vision.image_token_id] = True
        return logits.masked_fill(ban, BANNED_LOGIT)
