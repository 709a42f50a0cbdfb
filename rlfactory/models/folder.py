"""Is a folder a Hugging Face model folder? Checked without loading anything (no torch), so that the recipe
preflight (`rlfactory/preflight.py`) and `rlfactory sft` with `init: model` (`rlfactory/warmup/run.py`) name the same
problems before any work starts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def model_folder_problem(path: str | Path) -> str | None:
    """What keeps `path` from being a model folder, in words, or None when it has a readable config.json."""
    folder = Path(path)
    if not folder.is_dir():
        return f"folder not found: {path}"
    cfg = folder / "config.json"
    if not cfg.is_file():
        return f"{path} has no config.json (is it a Hugging Face model folder?)"
    try:
        config = json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        return f"{cfg} is not valid JSON ({e.msg})"
    if not isinstance(config, dict):
        return f"{cfg} holds no JSON object"
    return None


def model_config(path: str | Path) -> dict[str, Any]:
    """The folder's config.json; call `model_folder_problem` first."""
    return json.loads((Path(path) / "config.json").read_text())
