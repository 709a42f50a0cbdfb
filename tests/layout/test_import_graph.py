"""The package's import graph, read from the source (every import, also those inside functions): no module takes
part in an import cycle, and no folder imports one that comes later in the data path. The order is the one of
docs/concepts/architecture.md: recipe -> data -> models -> tools -> envs -> rollout -> reward -> rollout_side ->
algorithms -> report -> serve -> warmup -> trainer -> verl -> preflight -> api -> cli."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rlfactory"
# Where the two mapped folders of the checkout sit in the installed package (see setup.py).
MAPPED = {"rlfactory.rewards": REPO / "rewards", "rlfactory.envs.tools": REPO / "envs" / "tools"}

# Layers, first to last: a module may import its own layer and the layers before it, never a later one.
LAYERS = [
    ["rlfactory.errors", "rlfactory.starter"],
    ["rlfactory.recipe"],
    ["rlfactory.data"],
    ["rlfactory.models"],
    ["rlfactory.tools"],
    ["rlfactory.envs"],
    ["rlfactory.rollout"],
    ["rlfactory.reward", "rlfactory.rewards"],
    ["rlfactory.rollout_side"],
    ["rlfactory.algorithms"],
    ["rlfactory.report"],
    ["rlfactory.serve"],
    ["rlfactory.warmup"],
    ["rlfactory.trainer"],
    ["rlfactory.verl"],
    ["rlfactory.preflight"],
    ["rlfactory.api"],
    ["rlfactory.cli"],
]
FACADE = "rlfactory"  # rlfactory/__init__.py re-exports the API lazily; it belongs to no layer


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    roots = [("rlfactory", PACKAGE)] + list(MAPPED.items())
    for prefix, root in roots:
        for f in root.rglob("*.py"):
            rel = f.relative_to(root).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            mods[".".join((prefix, *rel))] = f
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    is_pkg = path.name == "__init__.py"
    pkg = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            r = _resolve(t) if t.startswith("rlfactory") else None
            # a submodule importing its own package's __init__ is not an edge (Python runs it first anyway)
            if r and r != module and not (MODULES[r].name == "__init__.py" and module.startswith(r + ".")):
                found.add(r)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> int | None:
    best = None
    for i, names in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and (best is None or len(n) > len(best[1])):
                best = (i, n)
    return None if best is None else best[0]


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if m != FACADE and _layer(m) is None)
    assert not missing, (f"modules outside every layer (add their folder to LAYERS and to "
                         f"docs/concepts/architecture.md): {missing}")


def test_no_import_cycles():
    cycles, state, stack = [], {}, []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(GRAPH[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_points_back_up_the_data_path():
    back = []
    for m, deps in GRAPH.items():
        if m == FACADE:
            continue
        for d in deps:
            if d != FACADE and _layer(d) > _layer(m):
                back.append(f"{m} -> {d}")
    assert not back, "imports from an earlier folder of the data path to a later one: " + ", ".join(sorted(back))


def test_the_graph_is_read():
    # the checks above mean something only if edges were found
    assert sum(len(d) for d in GRAPH.values()) > 100
    assert "rlfactory.recipe.schema" in GRAPH["rlfactory.preflight.recipe_check"]


def test_every_source_folder_is_a_regular_package():
    """setuptools' discovery ships only folders with an __init__.py: a namespace folder works from a checkout
    and is missing from the wheel."""
    root = Path(__file__).resolve().parents[2] / "rlfactory"
    missing = [str(d.relative_to(root.parent)) for d in root.rglob("*")
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert not missing, f"folders with modules but no __init__.py (left out of the wheel): {missing}"
