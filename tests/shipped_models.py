"""What every warm start shipped in models/ must be: a Hugging Face folder of a few MB in bf16, made by the recipe
its `sft_summary.json` names (the command a user reruns), and checked usable when it was made."""
from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def shipped_summary(model: str, made_by: str, *, prefix: bool = False, steps: int | None = None,
                    checked: bool = True) -> dict:
    """Assert the common facts of models/<model> and return its `sft_summary.json`. `made_by` is the command
    (`rlfactory sft recipes/<recipe>.yaml`), the summary's whole `made_by` unless `prefix` (then its start: a second
    stage's summary goes on to name the first's); `steps` the SFT steps, when the caller pins them; `checked`: the
    summary's usable-start check passed without errors."""
    folder = REPO / "models" / model
    summary = json.loads((folder / "sft_summary.json").read_text())
    assert (folder / "model.safetensors").stat().st_size < 16 * 2**20
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert summary["made_by"].startswith(made_by) if prefix else summary["made_by"] == made_by, summary["made_by"]
    if steps is not None:
        assert summary["steps"] == steps, summary["steps"]
    if checked:
        assert summary["check"]["usable"] and summary["check"]["errors"] == 0, summary["check"]
    return summary
