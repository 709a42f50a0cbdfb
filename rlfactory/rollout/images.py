"""Images in a rollout: how a tool result's images (and a task's prompt images) become chat-message parts for the
policy's template, and records on the Trajectory.

- A vision-language policy (`ChatFormat.vision` set) sees each image as an image part after the result's text; an
  image its processor refuses (an aspect ratio over 200, say) is left out and the text says why.
- A text-only policy cannot see images: the text says what was returned and that this model cannot see it, so the
  model gets feedback rather than silence, and nothing crashes.
Each shown image is recorded (`TrajectoryImage`: bytes as base64, sha256, where its placeholder tokens start, how
many) once per trajectory, so saved trajectories hold what the policy saw while the token arrays hold only ids.
With `rollout.keep_unseen_images`, the images a reset or a tool returned that the policy was not shown are kept
as well (`unseen`, `Trajectory.unseen_images`), for the viewer only (a task's own images are not: its data file
holds them).

A task's `images` (or its row's, `task["metadata"]["images"]`; shown in its first user turn): a list of image files
(`data/tasks.py` resolves them against the data file's folder) or `{"data_b64": ..., "mime_type": ...}` objects, each
checked like a tool's (tools/images.py).
Left out: images inside the policy's own output, and videos.
"""
from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.trajectory import SavedImage, TrajectoryImage
from rlfactory.tools.images import BadImage, ImageLimits, decode_image
from rlfactory.tools.types import ToolImage

logger = logging.getLogger(__name__)


def _note(image: ToolImage, why: str) -> str:
    return f"[image {image.width}x{image.height} {image.mime_type} not shown: {why}]"


def shown_images(chat: ChatFormat, images: list[ToolImage]) -> tuple[list[ToolImage], list[str]]:
    """The images the policy can be shown, and a note for each one it cannot (text-only policy, refused by the
    image processor)."""
    if not images:
        return [], []
    if chat.vision is None:
        return [], [_note(im, "this model cannot see images") for im in images]
    shown, notes = [], []
    for im in images:
        try:
            chat.vision.num_tokens(im)
        except (ValueError, OSError) as e:  # e.g. "absolute aspect ratio must be smaller than 200"
            notes.append(_note(im, f"the model's image processor refused it ({e})"))
        else:
            shown.append(im)
    return shown, notes


def message_content(text: str, images: list[ToolImage]) -> str | list[dict[str, Any]]:
    """A message's content: the text alone, or its text then one image part per image (named by sha256, which
    also keys the chat format's prompt cache)."""
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return parts + [{"type": "image", "image": im.sha256} for im in images]


def tool_content(chat: ChatFormat, text: str, images: list[ToolImage]) -> tuple[str, list[ToolImage]]:
    """One tool result as the policy reads it: its text (already neutralized and cut) with a note for each image it
    cannot be shown, and the images it is shown (`message_content` makes the message of the two)."""
    shown, notes = shown_images(chat, images)
    if notes:
        text = "\n".join([text, *notes]) if text else "\n".join(notes)
    return text, shown


def records(ids: list[int], offset: int, images: list[ToolImage], chat: ChatFormat, *, turn: int | None = None,
            tools: list[str] | None = None) -> list[TrajectoryImage]:
    """Records of `images`, whose placeholder runs lie in `ids` in order (`ids` start at index `offset` of
    prompt + response); `tools[k]`: the tool that returned image k."""
    if not images:
        return []
    pad = chat.vision.image_token_id  # images are only shown to a VL policy
    starts = [i for i, t in enumerate(ids) if t == pad and (i == 0 or ids[i - 1] != pad)]
    return [TrajectoryImage(**im.model_dump(), start=offset + s, tokens=chat.vision.num_tokens(im), turn=turn,
                            tool=tools[k] if tools else None)
            for k, (im, s) in enumerate(zip(images, starts))]


def unseen(images: list[ToolImage], shown: list[ToolImage], *, turn: int | None = None,
           tool: str | None = None) -> list[SavedImage]:
    """Records of the `images` the policy was not shown (`shown`: those it was), for the transcript only
    (`rollout.keep_unseen_images`)."""
    was_shown = {id(im) for im in shown}
    return [SavedImage(**im.model_dump(), turn=turn, tool=tool) for im in images if id(im) not in was_shown]


def task_images(task: dict[str, Any], limits: ImageLimits | None = None) -> list[ToolImage]:
    """The checked images of a task row's `images` (empty when it has none); raises ValueError naming the bad one."""
    raw = task.get("images") or (task.get("metadata") or {}).get("images") or []
    if not isinstance(raw, list):
        raise ValueError(f"task {task.get('id')!r}: `images` must be a list of image files or "
                         f"{{data_b64, mime_type}} objects")
    out = []
    for k, item in enumerate(raw):
        try:
            if isinstance(item, str):
                data = base64.b64encode(Path(item).read_bytes()).decode()
                out.append(decode_image(data, Path(item).suffix, limits or ImageLimits()))
            elif isinstance(item, dict) and isinstance(item.get("data_b64"), str):
                out.append(decode_image(item["data_b64"], str(item.get("mime_type", "")), limits or ImageLimits()))
            else:
                raise BadImage("expected a file path or {data_b64, mime_type}")
        except (OSError, BadImage) as e:
            raise ValueError(f"task {task.get('id')!r}: images[{k}]: {e}") from None
    return out


def prompt_with_images(chat: ChatFormat, messages: list[dict[str, Any]], task: dict[str, Any],
                       reset_images: list[ToolImage] | None = None) -> tuple[list[dict[str, Any]], list[ToolImage]]:
    """`messages` with the task's images shown in its first user turn and `reset_images` (the picture of an
    environment's first observation, the last user turn) in the last, and the images shown, in prompt order."""
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m.get("role") == "user"]
    at_message: dict[int, tuple[list[ToolImage], list[str]]] = {}
    for images, at, what in ((task_images(task), users[:1], "images"), (reset_images or [], users[-1:], "a reset")):
        if not images:
            continue
        if not at:
            raise ValueError(f"task {task.get('id')!r} has {what} with images but no user message to show them in")
        shown, notes = shown_images(chat, images)
        kept = at_message.setdefault(at[0], ([], []))
        kept[0].extend(shown)
        kept[1].extend(notes)
    shown_all: list[ToolImage] = []
    for i, (shown, notes) in sorted(at_message.items()):  # prompt order
        text = out[i].get("content")
        if not isinstance(text, str):
            raise ValueError(f"task {task.get('id')!r}: a prompt with images needs text user messages")
        if notes:
            text = "\n".join([*notes, text])
        # without an image to show, plain text: a text-only template renders only string content
        out[i]["content"] = ([{"type": "image", "image": im.sha256} for im in shown]
                             + [{"type": "text", "text": text}]) if shown else text
        shown_all += shown
    return out, shown_all
