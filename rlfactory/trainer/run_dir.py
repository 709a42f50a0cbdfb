"""Whether a run folder may be trained into: an existing run is never replaced by accident.

`rlfactory train` into a folder that already holds a run (its metrics, summary or checkpoints) refuses before any
work starts, unless `--resume` (continue it) or `--overwrite` (replace it: its metrics, transcripts and checkpoints
are deleted) says what to do. Both engines and the Python API (`rlfactory.api.train(..., overwrite=True)`) check.
"""
from __future__ import annotations

import os
from pathlib import Path

from rlfactory.errors import RLFactoryError

RUN_MARKERS = ("metrics.jsonl", "summary.json", "checkpoints")
"""What a started run leaves in its folder."""


def refuse_to_replace(output_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
    """Raise when `output_dir` holds a run and neither `resume` nor `overwrite` is set."""
    out = Path(output_dir)
    if resume or overwrite or not out.is_dir():
        return
    found = [name for name in RUN_MARKERS if (out / name).exists()]
    if found:
        raise RLFactoryError(
            f"{out} already holds a run ({', '.join(found)}); nothing was started. Pass --resume to continue it, "
            f"--overwrite to replace it (its metrics, transcripts and checkpoints are deleted), or choose another "
            f"--output-dir")
