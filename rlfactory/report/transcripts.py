"""Trajectories saved as JSONL, one file per step (training) or per evaluation, and read back for the viewer."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfactory.rollout.trajectory import Trajectory


def save_transcripts(path: Path, trajectories: list[Any]) -> None:
    """Trajectories as JSONL (the viewer and `report` read them back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajectories:
            f.write(t.model_dump_json() + "\n")


def load_transcripts(folder: Path) -> list[Any]:
    out = []
    for f in sorted(folder.glob("*.jsonl")):
        for ln in f.read_text().splitlines():
            if ln.strip():
                out.append(Trajectory.model_validate_json(ln))
    return out
