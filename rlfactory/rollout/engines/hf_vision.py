"""Pixel inputs for `HFEngine` on a vision-language policy (Qwen3-VL, Qwen2.5-VL): per request, the images of its
prompt and their multimodal rotary positions (mRoPE); per forward pass, the `position_ids` / `pixel_values` /
`image_grid_thw` the model takes.

Positions: a VL model takes position ids [4, B, T]: row 0 the plain count of real tokens (what the engine tracks per
row in `BatchKV`, used for the causal mask), rows 1-3 the mRoPE (temporal, height, width) positions. After an image,
mRoPE positions run behind the token count by a fixed amount per row (`rope_delta`, <= 0), so a decode step's
positions are the row's count plus its delta; a prefill's come from `models/vision.py` `mrope_positions` over the
whole prompt (a continued prefill takes the slice after its parked prefix). Text-only rows have delta 0 and equal
rows. The model's own cached `rope_deltas` is never used: it holds one batch's rows, and rows here join and leave.

Prefix cache: identical token ids do not mean identical images (every image's placeholders are the same id), so
requests are matched on `match_ids`, the prompt with each image's placeholder run replaced by ids derived from the
image's sha256 (negative, never a real token). A group's shared prompt and a conversation's parked keys/values are
then reused only for the same images. A parked prefix that would split an image is not continued (never happens
with chat turns: images sit inside tool turns, a parked prefix ends after a generated token).

Left out: videos; batching images of different requests into one vision-tower call beyond one prefill's rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from rlfactory.models.vision import VisionProcessor, mrope_positions
from rlfactory.tools.types import ToolImage


@dataclass
class VisionRequest:
    """What a request with images carries: its images in token order, its prompt's mRoPE positions and delta."""

    images: list[ToolImage]
    starts: list[int]
    """Index of each image's first placeholder in the prompt."""
    tokens: list[int]
    """Each image's placeholder count."""
    mrope: torch.Tensor
    """[3, len(prompt)] the prompt's mRoPE positions."""
    rope_delta: int
    """mRoPE position minus token count, for every token after the prompt's last image."""
    match_ids: list[int]


def _image_key(image: ToolImage) -> int:
    return -1 - int(image.sha256[:15], 16)  # negative: never a real token id


def prepare(prompt_ids: list[int], images: Sequence[ToolImage], vision: VisionProcessor | None,
            is_vl: bool) -> VisionRequest | None:
    """The request's vision record (None without images); ValueError when the policy cannot take these images or
    the prompt's placeholders do not match them."""
    if not images:
        return None
    if not is_vl or vision is None:
        raise ValueError("generate: images were given, but this policy is text-only (or its engine was built without "
                         "the policy's image processor: HFEngine(..., vision=vision_of(tokenizer)))")
    images = list(images)
    grids = [vision.grid(im) for im in images]
    pad = vision.image_token_id
    mrope = mrope_positions(prompt_ids, grids, pad, vision.merge_size)  # checks placeholders against the grids
    starts = [i for i, t in enumerate(prompt_ids) if t == pad and (i == 0 or prompt_ids[i - 1] != pad)]
    tokens = [t * h * w // vision.merge_size ** 2 for t, h, w in grids]
    match = list(prompt_ids)
    for im, s, n in zip(images, starts, tokens):
        match[s:s + n] = [_image_key(im)] * n
    return VisionRequest(images, starts, tokens, mrope, int(mrope.max()) + 1 - len(prompt_ids), match)


def _row_positions(vis: VisionRequest | None, text: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """[3, stop - start] mRoPE positions of prompt tokens [start, stop) (text: their plain positions [stop-start])."""
    if vis is None:
        return text.unsqueeze(0).expand(3, -1)
    return vis.mrope[:, start:stop].to(text.device)


def forward_inputs(visions: list[VisionRequest | None], positions: torch.Tensor, spans: list[tuple[int, int]],
                   vision: VisionProcessor | None) -> dict[str, Any]:
    """The VL model's extra forward arguments for a prefill of rows whose real tokens are prompt slices `spans[i]`
    (right-aligned in `positions` [n, S], the rows' plain positions): `position_ids` [4, n, S], and the pixels of
    the images inside the slices (in row order, then token order: how the model scatters image features)."""
    width = positions.shape[1]
    mrope = positions.unsqueeze(0).repeat(3, 1, 1)  # padding columns keep their (ignored) plain positions
    images: list[ToolImage] = []
    for i, (vis, (start, stop)) in enumerate(zip(visions, spans)):
        if vis is None:
            continue
        length = stop - start
        mrope[:, i, width - length:] = _row_positions(vis, positions[i, width - length:], start, stop)
        images.extend(im for im, s in zip(vis.images, vis.starts) if start <= s < stop)
    out: dict[str, Any] = {"position_ids": torch.cat([positions.unsqueeze(0), mrope], dim=0)}
    if images:
        pixel_values, grid = vision.pixel_inputs(images)
        out["pixel_values"], out["image_grid_thw"] = pixel_values.to(positions.device), grid.to(positions.device)
    return out


def usable_past(past: Any, vis: VisionRequest | None) -> Any:
    """`past` (a parked prefix, or None), unless it ends inside one of the prompt's images (then None)."""
    if past is None or vis is None:
        return past
    at = len(past.tokens)
    return None if any(s < at < s + n for s, n in zip(vis.starts, vis.tokens)) else past


def decode_positions(positions: torch.Tensor, deltas: list[int]) -> torch.Tensor:
    """[4, B, 1] position ids of a decode step from the rows' plain positions [B, 1] and mRoPE deltas."""
    delta = torch.tensor(deltas, dtype=positions.dtype, device=positions.device).view(-1, 1)
    shifted = positions + delta
    return torch.stack([positions, shifted, shifted, shifted])
