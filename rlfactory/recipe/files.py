"""Reading recipe files: a YAML file that must hold a mapping, and `--set dotted.key=value` overrides on the raw
mapping (before validation, so that a typo in an override is reported like a typo in the file)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from rlfactory.errors import ConfigError
from rlfactory.starter import not_found_hint


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors name the file and say what to fix."""
    if not path.exists():
        hint = not_found_hint()
        raise ConfigError(f"recipe file not found: {path}" + (f"; {hint}" if hint else ""), file=None)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(e, 'problem', e)}", file=str(path)) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"the top level must be a mapping of sections, got {type(raw).__name__}", file=str(path))
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str], *, source: str = "recipe") -> dict[str, Any]:
    """Apply `dotted.key=value` overrides (value parsed as YAML: numbers, booleans, lists); list items by index
    (`rewards.functions.0.weight=2`). Unknown keys are created, so the validator names them like any typo."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value", file=source)
        key, _, text = item.partition("=")
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: empty key segment", file=source)
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        node: Any = out
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {item!r}: {'.'.join(parts[:i]) or key} has no item {part}",
                                      file=source)
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
                continue
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[:i])} is not a section", file=source)
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
    return out
