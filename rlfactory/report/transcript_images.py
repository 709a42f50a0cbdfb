"""The images of a saved transcript: what a saved trajectory keeps of them (`bounded`), and how the transcript viewer
(and the dashboard, which embeds the viewer's trajectories) shows them (`TrajectoryFigures`). One module owns both
rules, so what is saved and what is drawn cannot drift apart.

Saving. A trajectory's `images` hold every image its policy saw (a vision-language policy's prompt pictures and
tool results), in token order, bytes included (and its `unseen_images`, with `rollout.keep_unseen_images`, those a
text-only policy read a note for instead): a pixel environment's episode of many turns, saved for every sampled
trajectory of every step, would grow without bound. So a saved trajectory keeps the bytes of each distinct image
(by sha256) once, at its first record; a later record of the same image keeps its place, size, tool and sha256 and
says `omitted="repeat"`. Past `max_bytes` (decoded, per trajectory: `trainer.log.transcript_image_bytes`) the bytes
of further images are not kept; their records say so in `omitted`, and the viewer shows that note in the image's
place. A saved trajectory is for reading: its image records are not pixel inputs for an update.

Showing. Each image appears at the turn whose tool returned it (a prompt's at the prompt) as an `<img>` with a
`data:` URI, so the viewer stays one file that works offline, with a caption: size, format, bytes, the tool,
sha256. A repeat shows the bytes of its first record again. Only the formats `tools/images.py` accepts, as
base64, reach a `src`; anything else in a hand-edited file becomes a note, and every text is escaped.

Left out: images a text-only policy was not shown, unless the run kept them (`rollout.keep_unseen_images`; its
tool turn always holds the note the policy read instead, which the viewer shows as text), sharing bytes across the
trajectories of one file (each line stays readable on its own), and resizing or re-encoding images to save space.
"""
from __future__ import annotations

import html
import re
from typing import Any, TypeVar

from rlfactory.recipe.training import LogConfig
from rlfactory.rollout.trajectory import SavedImage, Trajectory
from rlfactory.tools.images import ALLOWED_FORMATS

DEFAULT_TRANSCRIPT_IMAGE_BYTES: int = LogConfig.model_fields["transcript_image_bytes"].default
"""Image bytes a saved trajectory keeps by default (the recipe's `trainer.log.transcript_image_bytes`)."""

REPEAT = "repeat"
ImageT = TypeVar("ImageT", bound=SavedImage)
_MIMES = frozenset(ALLOWED_FORMATS.values())
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_MIN_SHOWN_PX = 160
"""A smaller image (a 56x56 grid world) is drawn scaled up by a whole factor, pixelated, so it can be read."""

CSS = """
.timgs{display:flex;flex-wrap:wrap;gap:8px;margin:4px 0 2px}
.timg{margin:0;background:#fff;border:1px solid #ccd;border-radius:4px;padding:4px;max-width:100%}
.timg img{display:block;max-width:min(100%,800px);height:auto;image-rendering:pixelated;background:#eee}
.timg figcaption,.timg-note{font-size:11.5px;color:#555;font-family:ui-monospace,monospace}
.timg-note{border:1px dashed #c99;border-radius:4px;padding:3px 6px;color:#744}
"""
"""The figures' styles (part of the viewer's, so the dashboard gets them too)."""


def bounded(t: Trajectory, max_bytes: int = DEFAULT_TRANSCRIPT_IMAGE_BYTES) -> Trajectory:
    """`t` as a transcript saves it: each distinct image's bytes once, at most `max_bytes` of them, the images the
    policy saw first (see the module docstring); `t` itself is left unchanged."""
    if not t.images and not t.unseen_images:
        return t
    kept: set[str] = set()
    used = 0

    def keep(im: ImageT) -> ImageT:
        nonlocal used
        if im.omitted is not None or not im.data_b64:  # bounded before: nothing more to take away
            return im
        if im.sha256 in kept:
            return im.model_copy(update={"data_b64": "", "omitted": REPEAT})
        if used + im.num_bytes > max_bytes:
            return im.model_copy(update={"data_b64": "", "omitted": (
                f"not saved: the trajectory's images would take {used + im.num_bytes} bytes, over "
                f"trainer.log.transcript_image_bytes ({max_bytes})")})
        kept.add(im.sha256)
        used += im.num_bytes
        return im

    images = [keep(im) for im in t.images]
    return t.model_copy(update={"images": images, "unseen_images": [keep(im) for im in t.unseen_images]})


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _size(num_bytes: int) -> str:
    return f"{num_bytes} B" if num_bytes < 1024 else f"{num_bytes / 1024:.1f} KiB"


class TrajectoryFigures:
    """One trajectory's images as HTML, by where they were shown: `at(None)` the prompt's, `at(k)` those the tool
    calls of assistant turn k returned."""

    def __init__(self, t: Trajectory):
        both = [*t.images, *t.unseen_images]
        self._bytes = {im.sha256: im.data_b64 for im in both if im.data_b64 and im.omitted is None}
        self._unseen = {id(im) for im in t.unseen_images}
        self._at: dict[int | None, list[SavedImage]] = {}
        for im in both:
            self._at.setdefault(im.turn, []).append(im)

    def __len__(self) -> int:
        return sum(len(v) for v in self._at.values())

    def at(self, turn: int | None) -> str:
        images = self._at.get(turn, [])
        return f'<div class="timgs">{"".join(self._figure(im) for im in images)}</div>' if images else ""

    def _figure(self, im: SavedImage) -> str:
        where = im.tool or "the prompt"
        data = im.data_b64 or self._bytes.get(im.sha256, "")
        size = _size(len(data) * 3 // 4 - data[-2:].count("=")) if data else "?"
        caption = f"{im.width}×{im.height} {im.mime_type} · {size} · {where} · sha256 {im.sha256[:12]}"
        if id(im) in self._unseen:
            caption += " · not shown to the policy (it read a note)"
        if im.omitted == REPEAT:
            caption += " · an earlier image's repeat"
        if not data:
            why = im.omitted if im.omitted and im.omitted != REPEAT else "not saved"
            return f'<div class="timg-note">image {_e(caption)}: {_e(why)}</div>'
        if im.mime_type not in _MIMES or not _BASE64.fullmatch(data):
            return (f'<div class="timg-note">image {_e(caption)}: not shown: the saved record is not a '
                    f'{"/".join(sorted(_MIMES))} image in base64</div>')
        scale = max(1, -(-_MIN_SHOWN_PX // max(1, im.width, im.height)))  # ceil: a whole factor keeps pixels square
        return (f'<figure class="timg"><img src="data:{_e(im.mime_type)};base64,{data}" '
                f'width="{int(im.width) * scale}" height="{int(im.height) * scale}" data-sha256="{_e(im.sha256)}" '
                f'alt="{_e(f"image {im.width}x{im.height} from {where}")}"><figcaption>{_e(caption)}</figcaption>'
                "</figure>")
