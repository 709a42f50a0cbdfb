"""Session fixtures for the trainer, algorithm and rollout-CLI tests: one tiny real setup (tokenizer trained on
calculator transcripts, random tiny Qwen3, arithmetic tasks, the real calculator MCP server, a recipe), built once
and copied per test."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_setup_master(tmp_path_factory) -> Path:
    from tiny_setup import build_tiny_setup

    root = tmp_path_factory.mktemp("tiny_setup")
    build_tiny_setup(root)
    return root


@pytest.fixture
def tiny_recipe(tiny_setup_master, tmp_path) -> Path:
    """A private copy of the tiny setup (its recipe writes its run folder inside the copy)."""
    import yaml

    root = tmp_path / "setup"
    shutil.copytree(tiny_setup_master, root, ignore=shutil.ignore_patterns("run*"))
    path = root / "recipe.yaml"
    rec = yaml.safe_load(path.read_text())
    rec["trainer"]["output_dir"] = str(root / "run")
    path.write_text(yaml.safe_dump(rec, sort_keys=False))
    return path
