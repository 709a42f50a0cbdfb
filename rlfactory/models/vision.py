"""Vision-language policies (Qwen3-VL, Qwen2.5-VL): what turns images into a policy's inputs, for every part of
rlfactory that feeds the model (the chat format's placeholder tokens, the HF engine, the update).

- `VisionProcessor`: the model's image processor (Qwen2-VL's resizing and patching, PIL backend) and its special
  tokens. `num_tokens(image)` is how many `<|image_pad|>` tokens an image takes, `pixel_inputs(images)` the
  `pixel_values` / `image_grid_thw` the model's forward takes. transformers' own `Qwen3VLProcessor` is not used: it
  insists on a video processor, which needs torchvision (not a dependency here), and rlfactory expands the
  placeholders itself anyway, so that tool-turn deltas stay token-exact (rollout/images.py).
- `mrope_positions(ids, grids)`: the multimodal rotary positions (mRoPE) of a token sequence, as the model's
  `get_rope_index` computes them, from ids and image grids alone: the engine and the update pass them explicitly
  (the model's own cached `rope_deltas` is per call, not per row of a continuous batch).
- `vision_of(tokenizer)`: the processor attached to a VL policy's tokenizer (`attach_vision`), so every
  `ChatFormat` built from that tokenizer renders images without another argument through the call sites.

Left out: videos, and image placeholders inside the policy's own output (a policy never emits images).
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch is imported where tensors are made: a chat format of a text policy never needs it
    import torch

logger = logging.getLogger(__name__)


class Picture(Protocol):
    """An image as this module needs it: a checked image's base64 bytes and their sha256 (`tools.types.ToolImage`,
    which sits later on the data path than models/)."""

    @property
    def data_b64(self) -> str: ...

    @property
    def sha256(self) -> str: ...


def pil_image(image: Picture) -> Any:
    """The image as an RGB PIL image (what image processors take)."""
    import base64
    import io

    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(image.data_b64))) as img:
        return img.convert("RGB")

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VL_MODEL_TYPES = ("qwen3_vl", "qwen2_5_vl")
"""`config.model_type`s loaded as vision-language policies."""
PIXEL_CACHE_BYTES = 64 * 2**20
"""Pixel tensors kept per processor (by sha256; the least recently used go first): a GRPO group's samples and every
turn re-read the same images, and memory stays bounded whatever the images."""


class VisionProcessor:
    """Images → placeholder counts and pixel inputs for one VL policy."""

    def __init__(self, image_processor: Any, tokenizer: Any):
        self.image_processor = image_processor
        self.merge_size = int(image_processor.merge_size)
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (VISION_START, VISION_END, IMAGE_PAD)}
        missing = [t for t, i in ids.items() if not isinstance(i, int) or i == tokenizer.unk_token_id]
        if missing:
            raise ValueError(f"the tokenizer has no {', '.join(missing)} token: not a Qwen-VL tokenizer")
        self.vision_start_id, self.vision_end_id, self.image_token_id = (ids[VISION_START], ids[VISION_END],
                                                                         ids[IMAGE_PAD])
        self._cache: OrderedDict[str, tuple[torch.Tensor, tuple[int, int, int]]] = OrderedDict()
        self._lock = threading.Lock()
        self._cached_bytes = 0

    def _processed(self, image: Picture) -> tuple[torch.Tensor, tuple[int, int, int]]:
        with self._lock:  # the event loop (grids) and the engine's worker thread (pixels) share the cache
            hit = self._cache.get(image.sha256)
            if hit is not None:
                self._cache.move_to_end(image.sha256)
                return hit
        out = self.image_processor(images=[pil_image(image)], return_tensors="pt")
        entry = (out["pixel_values"], tuple(int(x) for x in out["image_grid_thw"][0]))
        with self._lock:
            if image.sha256 not in self._cache:
                self._cache[image.sha256] = entry  # type: ignore[assignment]
                self._cached_bytes += entry[0].numel() * entry[0].element_size()
            while self._cached_bytes > PIXEL_CACHE_BYTES and len(self._cache) > 1:
                _, (old, _grid) = self._cache.popitem(last=False)
                self._cached_bytes -= old.numel() * old.element_size()
        return entry  # type: ignore[return-value]

    def grid(self, image: Picture) -> tuple[int, int, int]:
        """The image's (t, h, w) patch grid; raises ValueError for an image the processor refuses (e.g. an aspect
        ratio over 200)."""
        return self._processed(image)[1]

    def num_tokens(self, image: Picture) -> int:
        """`<|image_pad|>` tokens the image takes in the prompt."""
        t, h, w = self.grid(image)
        return t * h * w // (self.merge_size ** 2)

    def pixel_inputs(self, images: list[Picture]) -> tuple[torch.Tensor, torch.Tensor]:
        """`pixel_values` [patches, C*T*P*P] and `image_grid_thw` [n, 3] for `images`, in order."""
        import torch

        parts = [self._processed(im) for im in images]
        return (torch.cat([p for p, _ in parts]),
                torch.tensor([g for _, g in parts], dtype=torch.long))


def attach_vision(tokenizer: Any, processor: VisionProcessor) -> Any:
    """Mark `tokenizer` as a VL policy's, with its processor (`vision_of`). Returns it."""
    tokenizer.rlfactory_vision = processor
    return tokenizer


def vision_of(tokenizer: Any) -> VisionProcessor | None:
    """The VisionProcessor of a VL policy's tokenizer; None for a text-only policy."""
    return getattr(tokenizer, "rlfactory_vision", None)


def is_vision_model(model: Any) -> bool:
    """Whether `model` (or the model under a LoRA wrapper) takes pixel inputs."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in VL_MODEL_TYPES or hasattr(config, "vision_config")


def mrope_positions(ids: list[int], grids: list[tuple[int, int, int]], image_token_id: int,
                    merge_size: int) -> torch.Tensor:
    """[3, len(ids)] mRoPE positions (temporal, height, width) of one sequence, as Qwen3-VL's `get_rope_index`
    gives them for images: text tokens count on from the last position; an image's tokens take (t, row, column)
    offsets from where the image starts, and the text after it goes on from there plus the image's larger side.
    `grids[k]` is the k-th image's (t, h, w) patch grid, in order of its run of `image_token_id` tokens."""
    import torch

    out = torch.empty((3, len(ids)), dtype=torch.long)
    cur, i, k, n = 0, 0, 0, len(ids)
    while i < n:
        j = i
        while j < n and ids[j] != image_token_id:
            j += 1
        if j > i:
            out[:, i:j] = torch.arange(cur, cur + j - i)
            cur += j - i
        if j >= n:
            break
        if k >= len(grids):
            raise ValueError(f"the sequence has more images than the {len(grids)} given")
        t, h, w = grids[k]
        gh, gw = h // merge_size, w // merge_size
        size = t * gh * gw
        if ids[j:j + size] != [image_token_id] * size:
            raise ValueError(f"image {k} takes {size} tokens but its placeholder run is shorter")
        tt = torch.arange(t).view(-1, 1).expand(-1, gh * gw).flatten()
        hh = torch.arange(gh).view(1, -1, 1).expand(t, -1, gw).flatten()
        ww = torch.arange(gw).view(1, 1, -1).expand(t, gh, -1).flatten()
        out[0, j:j + size], out[1, j:j + size], out[2, j:j + size] = tt + cur, hh + cur, ww + cur
        cur += max(gh, gw)
        i, k = j + size, k + 1
    if k != len(grids):
        raise ValueError(f"{len(grids)} images given, the sequence holds {k}")
    return out


def load_vision_processor(folder: str | Path, tokenizer: Any) -> VisionProcessor:
    """The image processor of a local Qwen-VL folder (its preprocessor_config.json, read by the PIL backend)."""
    from transformers import Qwen2VLImageProcessorPil

    path = Path(folder) / "preprocessor_config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: a Qwen-VL model folder ships its image processor's settings")
    settings = {k: v for k, v in json.loads(path.read_text()).items()
                if k in ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "size",
                         "min_pixels", "max_pixels")}
    return VisionProcessor(Qwen2VLImageProcessorPil(**settings), tokenizer)


TINY_MIN_PIXELS = 32 * 32
TINY_MAX_PIXELS = 32 * 32 * 64
"""The tiny VL model's image processor resizes every image to between 1 and 64 image tokens (32x32 pixels each)."""


def tiny_vision_processor(tokenizer: Any) -> VisionProcessor:
    """The processor of `tiny-random-vl` (models/tiny.py `build_tiny_qwen3_vl`): 16-pixel patches, 2x2 merge."""
    from transformers import Qwen2VLImageProcessorPil

    return VisionProcessor(Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": TINY_MIN_PIXELS, "longest_edge": TINY_MAX_PIXELS}), tokenizer)


def vl_chat_template() -> str:
    """The project's Qwen3-VL chat template (models/templates/qwen3_vl.jinja)."""
    return (Path(__file__).parent / "templates" / "qwen3_vl.jinja").read_text(encoding="utf-8")


def save_tokenizer(tokenizer: Any, folder: str | Path) -> None:
    """Save a policy's tokenizer into a model folder, with a VL policy's image processor settings
    (preprocessor_config.json), so the folder loads back as the same policy (`load_vision_processor`)."""
    tokenizer.save_pretrained(str(folder))
    vision = vision_of(tokenizer)
    if vision is not None:
        vision.image_processor.save_pretrained(str(folder))
