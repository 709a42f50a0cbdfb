"""Every `from rlfactory... import name` in the benchmarks, examples and CI scripts names something that exists.

Those scripts import inside functions (they run their heavy imports late), so a module that moved leaves them
broken without any test importing them: bench/hf_decode.py still imported `rlfactory.rollout.hf_kv` after the engines
moved to `rlfactory/rollout/engines/`."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for d in ("bench", "examples", ".ci") if (REPO / d).is_dir() for p in (REPO / d).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str, str | None]]:
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "rlfactory":
            out += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "rlfactory"]
    return out


def test_the_scripts_are_found():
    assert any(p.parent.name == "bench" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_rlfactory_imports_resolve(path: Path):
    missing = []
    for line, module, name in _imports(path):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{path.relative_to(REPO)}:{line}: import {module}: {e}")
            continue
        if name is None or name == "*" or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append(f"{path.relative_to(REPO)}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
