"""Is a folder a Hugging Face model folder? Checked without loading anything (no torch), so that the recipe
preflight (`rlfactory/preflight/model_checks.py`) and `rlfactory sft` with `init: model` (`rlfactory/warmup/run.py`)
name the same problems before any work starts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_model_config(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """The folder's config.json and None, or None and what keeps `path` from being a model folder, in words."""
    folder = Path(path)
    if not folder.is_dir():
        return None, f"folder not found: {path}"
    cfg = folder / "config.json"
    if not cfg.is_file():
        return None, f"{path} has no config.json (is it a Hugging Face model folder?)"
    try:
        config = json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        return None, f"{cfg} is not valid JSON ({e.msg})"
    if not isinstance(config, dict):
        return None, f"{cfg} holds no JSON object"
    return config, None
