"""The `rlfactory` command line.

Each concern registers its own commands from a module in `rlfactory/commands/` (a `register(app)` function), so this
file stays a list and heavy imports happen only inside the command that needs them.
"""
from __future__ import annotations

import importlib
import logging
import pkgutil

import typer

import rlfactory.commands as _commands

app = typer.Typer(
    name="rlfactory",
    help="Train LLM agents to use tools (MCP servers) with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


for _info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"rlfactory.commands.{_info.name}").register(app)


if __name__ == "__main__":
    app()
