"""The architecture table (docs/concepts/architecture.md, "The package, folder by folder", moved there from the
README) names every folder and top-level module of the package, and every path it names exists: the map stays true
to the tree."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "concepts" / "architecture.md"


def _table() -> str:
    return "\n".join(line for line in PAGE.read_text().splitlines() if line.startswith("| `"))


def test_every_folder_and_top_level_module_is_in_the_table():
    table = _table()
    parts = [p.name for p in sorted((REPO / "rlfactory").iterdir())
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")]
    missing = [p for p in parts if f"`rlfactory/{p}" not in table]
    assert not missing, f"{PAGE.relative_to(REPO)}: the architecture table lacks: {missing}"


def test_every_path_the_table_names_exists():
    named = set(re.findall(r"`((?:rlfactory|envs|rewards|mcp_configs|recipes|tests|bench|docs)/[\w/.]*)`", _table()))
    assert len(named) > 15
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"{PAGE.relative_to(REPO)}: the architecture table names paths that do not exist: {missing}"
