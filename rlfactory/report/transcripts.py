"""Trajectories saved as JSONL, one file per step (training) or per evaluation, and read back for the viewer.

Every writer of transcripts (the local trainer, verl's run folder, evaluation, `rlfactory rollout --out`) writes
lines made by `transcript_line`, so each keeps images the same bounded way (transcript_images.py: each distinct
image once, at most `trainer.log.transcript_image_bytes` of them a trajectory).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfactory.report.transcript_images import DEFAULT_TRANSCRIPT_IMAGE_BYTES, bounded
from rlfactory.rollout.trajectory import Trajectory


def transcript_line(t: Trajectory, max_image_bytes: int = DEFAULT_TRANSCRIPT_IMAGE_BYTES) -> str:
    """One saved trajectory: its JSON, images bounded (no newline)."""
    return bounded(t, max_image_bytes).model_dump_json()


def save_transcripts(path: Path, trajectories: list[Any],
                     max_image_bytes: int = DEFAULT_TRANSCRIPT_IMAGE_BYTES) -> None:
    """Trajectories as JSONL (the viewer and `report` read them back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajectories:
            f.write(transcript_line(t, max_image_bytes) + "\n")


def load_transcripts(folder: Path) -> list[Any]:
    out = []
    for f in sorted(folder.glob("*.jsonl")):
        for ln in f.read_text().splitlines():
            if ln.strip():
                out.append(Trajectory.model_validate_json(ln))
    return out
