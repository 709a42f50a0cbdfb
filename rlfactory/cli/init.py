"""CLI: `rlfactory init DIR` (a starter project to edit: recipes, mcpServers configs, data, the quickstart's model)
and `rlfactory recipes` (the shipped recipes, which every command also finds by name)."""
from __future__ import annotations

from pathlib import Path

import typer
import yaml
from rich.table import Table

from rlfactory.cli.common import console, fail
from rlfactory.errors import RLFactoryError
from rlfactory.starter import FOLDERS, copy_starter, shipped_recipes


def init_cmd(
    folder: Path = typer.Argument(..., help="Folder to create (or fill) with the starter project."),
    force: bool = typer.Option(False, "--force", help="Overwrite files of the starter project already there."),
) -> None:
    """Copy the starter project (recipes/, mcp_configs/, data/, models/, examples/) into FOLDER."""
    try:
        written = copy_starter(folder, overwrite=force)
    except RLFactoryError as e:
        fail(str(e))
    console.print(f"wrote {len(written)} files into {folder}/ ({', '.join(f + '/' for f in FOLDERS)})\n"
                  f"next: cd {folder} && rlfactory setup-mcp && rlfactory train recipes/quickstart.yaml",
                  highlight=False, soft_wrap=True)


def recipes_cmd() -> None:
    """List the shipped recipes: give a name where a command takes a recipe file (`rlfactory train quickstart`)."""
    table = Table(show_header=True)
    table.add_column("name")
    table.add_column("description", overflow="fold")
    for name, path in shipped_recipes().items():
        try:
            description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except yaml.YAMLError:
            description = "(not valid YAML)"
        table.add_row(name, str(description))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("init")(init_cmd)
    app.command("recipes")(recipes_cmd)
