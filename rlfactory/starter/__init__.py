"""The starter project shipped with rlfactory: its recipes, `mcpServers` configs, task data, examples and the
quickstart's warm checkpoint, laid out as in the repository so that every relative path in them holds.

In a checkout these are the repository's own top-level folders. An installed wheel carries a copy of them here, in
`rlfactory/starter/` (see setup.py). `rlfactory init DIR` copies them into a folder of your own, and a command that
takes a recipe finds a shipped one by name (`rlfactory train quickstart`) when no file of that name exists.

Left out: fetching anything (rlfactory never downloads); models other than the tiny quickstart checkpoint.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from rlfactory.errors import RLFactoryError

FOLDERS = ("recipes", "mcp_configs", "data", "models", "examples")
"""The starter project's folders, relative to its root."""

_HERE = Path(__file__).resolve().parent


def starter_root() -> Path:
    """The folder holding recipes/, mcp_configs/, data/, models/: the wheel's copy, else the checkout's root."""
    if (_HERE / "recipes").is_dir():
        return _HERE
    checkout = _HERE.parents[1]
    if (checkout / "recipes").is_dir() and (checkout / "rlfactory").is_dir():
        return checkout
    raise RLFactoryError(f"this installation of rlfactory carries no starter project (no recipes/ in {_HERE} or "
                         f"{checkout}); reinstall it from a wheel or a checkout")


def shipped_recipes() -> dict[str, Path]:
    """Recipe name (file stem) -> path of every shipped recipe."""
    return {p.stem: p for p in sorted((starter_root() / "recipes").glob("*.yaml"))}


def find_recipe(arg: str | Path) -> Path:
    """`arg` itself when it names a file; else the shipped recipe of that name (`quickstart`, `quickstart.yaml`);
    else `arg` unchanged, for the caller to report as not found (see `not_found_hint`)."""
    path = Path(arg)
    if path.exists() or path.parent != Path("."):
        return path
    found = shipped_recipes().get(path.stem if path.suffix in (".yaml", ".yml") else path.name)
    return found if found is not None else path


def not_found_hint() -> str:
    """What to say after "recipe file not found": the shipped names, and how to get copies to edit."""
    try:
        names = ", ".join(shipped_recipes())
    except RLFactoryError:
        return ""
    return f"give a recipe file, or the name of a shipped one ({names}); `rlfactory init DIR` copies them to edit"


def default_mcp_config() -> Path:
    """The shipped `mcp_configs/default.json` (calculator, search, python)."""
    return starter_root() / "mcp_configs" / "default.json"


def copy_starter(dest: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Copy the starter project into `dest` (created if needed); returns the files written.

    Refuses, before writing anything, when a file it would write already exists, unless `overwrite`."""
    root, dest = starter_root(), Path(dest)
    plan: list[tuple[Path, Path]] = []
    for folder in FOLDERS:
        for src in sorted((root / folder).rglob("*")):
            if src.is_file() and not _skipped(src.relative_to(root)):
                plan.append((src, dest / src.relative_to(root)))
    clashes = [d for _, d in plan if d.exists()]
    if clashes and not overwrite:
        shown = ", ".join(str(c) for c in clashes[:3]) + (f" and {len(clashes) - 3} more" if len(clashes) > 3 else "")
        raise RLFactoryError(f"{dest}: {len(clashes)} file(s) of the starter project are already there ({shown}); "
                             f"nothing was copied. Pick an empty folder, or pass --force to overwrite them")
    for src, out in plan:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
    return [out for _, out in plan]


def _skipped(rel: Path) -> bool:
    # Python files and caches of the mapped packages are not part of the project a user copies.
    return rel.suffix in (".py", ".pyc") or "__pycache__" in rel.parts
