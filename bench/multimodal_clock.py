"""The image path's seconds for bench/multimodal.py, by part, measured in place: `instrument(model)` wraps the
functions that check, decode and process images and hooks the policy's vision tower; `ImagePathClock.since` gives
what a phase (a rollout, an update) spent in each.

Parts: `tool_decode_s` (`mcp_client.decode_image`: the tool result's check and full decode), `pixel_processing_s`
(`VisionProcessor._processed`: PIL decode, resize and patching, cached by sha256; `hf_vision.prepare` and
`PixelRows.build`: grids and mRoPE positions), `vision_tower_forward_s` and `vision_tower_backward_s`.
Left out: the image placeholder tokens' share of the text stack's work (they are tokens like any other there).
"""
from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


class ImagePathClock:
    """Seconds of the image path by part: functions wrapped in place (only the outermost timed call of a thread
    counts, so nested parts are not counted twice) and the vision tower's forward and backward hooks."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._local = threading.local()
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, part: str) -> None:
        raw = vars(owner)[name]
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._local.depth = depth
                if depth == 0:
                    self.seconds[part] += time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, raw))

    def hook_tower(self, model: Any) -> None:
        """Time the vision tower (the module named `...visual`): its forward by module hooks; its backward from the
        first gradient reaching its outputs to the gradient of its patch embedding's weight (the tower's first
        operation, so its last in the backward pass). Module backward hooks do not fire: the tower returns a
        `ModelOutput`, not tensors."""
        import torch

        tower = next((m for n, m in model.named_modules() if n.split(".")[-1] == "visual"), None)
        if tower is None:
            raise SystemExit(f"{type(model).__name__} has no `visual` module: not a Qwen-VL policy")
        first = next(tower.patch_embed.parameters())
        starts: dict[str, float] = {}

        def pre(*_: Any) -> None:
            starts["forward"] = time.perf_counter()

        def grad_arrives(grad: Any) -> Any:
            starts.setdefault("backward", time.perf_counter())
            return grad

        def post(_module: Any, _args: Any, out: Any) -> None:
            self.seconds["vision_tower_forward_s"] += time.perf_counter() - starts.pop("forward")
            if torch.is_grad_enabled():
                for value in (out.values() if hasattr(out, "values") else out):
                    for t in (value if isinstance(value, (list, tuple)) else [value]):
                        if isinstance(t, torch.Tensor) and t.requires_grad:
                            t.register_hook(grad_arrives)

        def backward_done(_param: Any) -> None:
            if "backward" in starts:
                self.seconds["vision_tower_backward_s"] += time.perf_counter() - starts.pop("backward")

        handles = [tower.register_forward_pre_hook(pre), tower.register_forward_hook(post)]
        if first.requires_grad:
            handles.append(first.register_post_accumulate_grad_hook(backward_done))
        self._undo += [h.remove for h in handles]

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)

    def since(self, before: dict[str, float]) -> dict[str, float]:
        return {k: v - before.get(k, 0.0) for k, v in self.seconds.items()}

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def instrument(model: Any) -> ImagePathClock:
    from rlfactory.algorithms.pixels import PixelRows
    from rlfactory.models.vision import VisionProcessor
    from rlfactory.rollout.engines import hf_vision
    from rlfactory.tools import mcp_client

    clock = ImagePathClock()
    clock.wrap(mcp_client, "decode_image", "tool_decode_s")
    clock.wrap(VisionProcessor, "_processed", "pixel_processing_s")
    clock.wrap(hf_vision, "prepare", "pixel_processing_s")
    clock.wrap(PixelRows, "build", "pixel_processing_s")
    clock.hook_tower(model)
    return clock
