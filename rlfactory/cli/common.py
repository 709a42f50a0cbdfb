"""Helpers shared by CLI commands: one way to report a user error (no traceback), to check a recipe before any work,
and to run a coroutine."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Coroutine, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from rlfactory.errors import RLFactoryError
from rlfactory.starter import find_recipe

console = Console()
err_console = Console(stderr=True)

RECIPE_HELP = "Recipe YAML file, or the name of a shipped recipe (`rlfactory recipes` lists them)."
SET_HELP = ("Override a recipe field: --set dotted.key=value (repeatable; values are YAML; relative paths resolve "
            "against the recipe's folder), e.g. --set trainer.total_steps=10.")


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a user-facing error (no traceback) and exit non-zero."""
    err_console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine; library errors (RLFactoryError) become clean CLI errors."""
    try:
        return asyncio.run(coro)
    except RLFactoryError as e:
        fail(str(e))


def recipe_file(arg: Path) -> Path:
    """A recipe argument as a file: the file itself, or a shipped recipe of that name (`rlfactory train quickstart`)."""
    return find_recipe(arg)


def check_or_fail(recipe_path: Path, overrides: list[str], *, for_training: bool) -> Any:
    """The validated Recipe; on any problem, print them all and exit before anything starts. Warnings go to stderr.
    `recipe_path` may name a shipped recipe (see `recipe_file`)."""
    from rlfactory.preflight import check_recipe  # here, not at the top: keeps `rlfactory --help` fast

    recipe_path = recipe_file(recipe_path)
    check = check_recipe(recipe_path, overrides, for_training=for_training)
    for w in check.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
    if not check.ok:
        n = len(check.errors)
        fail(f"{recipe_path}: {n} problem{'s' if n > 1 else ''} (nothing was started):\n"
             + "\n".join(f"  - {e}" for e in check.errors))
    return check.recipe
