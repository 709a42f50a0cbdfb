"""The documented tool commands, run as written in a folder laid out like a fresh clone, and the shipped
`mcpServers` files as the recipes use them.

The commands are read from the first bash block of the "Writing an MCP tool" guide (docs/guides/mcp-tools.md, where
the README's tool reference moved), so this test follows the documentation: each line starting with `rlfactory` runs
once, or twice when it shows an optional part in brackets (`tools list [-c mcp_configs/default.json]`: without it
and with it), in the order written."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_helpers import inserted

from rlfactory.recipe.schema import Recipe
from rlfactory.tools.mcp_configs import load_mcp_config, load_recipe_servers

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "mcp-tools.md"
BIN = Path(sys.executable).parent / "rlfactory"


def readme_tool_commands() -> list[list[str]]:
    """The `rlfactory ...` lines of the guide's first bash block, split as a shell would (comments gone), with
    `[optional words]` expanded into the line without them and the line with them."""
    block = re.search(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)
    assert block, f"{GUIDE.relative_to(REPO)}: no ```bash block"
    commands: list[list[str]] = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0] != "rlfactory":
            continue
        opens = [i for i, w in enumerate(words) if w.startswith("[")]
        closes = [i for i, w in enumerate(words) if w.endswith("]")]
        if opens and closes:
            i, j = opens[0], closes[0]
            optional = [*words[i:j + 1]]
            optional[0], optional[-1] = optional[0][1:], optional[-1][:-1]
            optional = [w for w in optional if w]
            commands.append(words[:i] + words[j + 1:])
            commands.append(words[:i] + optional + words[j + 1:])
        else:
            commands.append(words)
    return commands


def run(words: list[str], cwd: Path) -> subprocess.CompletedProcess:
    exe = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "rlfactory.cli"]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*exe, *words[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_readme_tool_commands_run_as_written_in_a_fresh_clone(tmp_path):
    commands = readme_tool_commands()
    shown = [shlex.join(c) for c in commands]
    # the commands the guide promises work (if one is reworded, this names it)
    assert "rlfactory tools call calculator.calculator '{\"expression\": \"2**100\"}'" in shown, shown
    assert "rlfactory tools list" in shown and "rlfactory setup-mcp" in shown, shown
    # a fresh clone's mcp_configs/, every shipped file in it (the commands read nothing else of the checkout)
    shutil.copytree(REPO / "mcp_configs", tmp_path / "mcp_configs")
    shipped_default = (REPO / "mcp_configs" / "default.json").read_text()
    added: str | None = None
    for words, line in zip(commands, shown):
        r = run(words, tmp_path)
        assert r.returncode == 0, f"`{line}` failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr, line
        if words[1] == "new-tool":
            added = words[2]
            config = (tmp_path / "mcp_configs" / "default.json").read_text()
            assert f'"{added}": {{' in inserted(shipped_default, config)  # the rest of the file as shipped
            assert set(json.loads(config)["mcpServers"]) == {"calculator", "search", "python", added}
        elif words[1] == "setup-mcp":
            assert "all servers healthy" in r.stdout
            assert all(name in r.stdout for name in ("calculator", "search", "python", *([added] if added else [])))
        elif words[1:3] == ["tools", "list"]:
            assert re.search(r"│ calculator\s+│ calculator\s+│ expression", r.stdout), r.stdout
            assert "textcraft" not in r.stdout  # the default is default.json, not every file in mcp_configs/
        elif words[1:3] == ["tools", "call"]:
            assert r.stdout.splitlines()[0] == str(2**100)


def test_every_shipped_mcp_config_loads_on_its_own():
    """The shipped files are alternatives (several define `textcraft`): each must be valid alone."""
    for path in sorted((REPO / "mcp_configs").glob("*.json")):
        assert load_mcp_config(path), path


@pytest.mark.parametrize("path", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_resolves_its_tool_servers(path):
    recipe = Recipe.from_yaml(path)
    if not recipe.tools.mcp_configs:
        pytest.skip(f"{path.name} uses no tools")
    servers = load_recipe_servers(recipe.tools)
    assert servers, f"{path.name}: no server chosen from {recipe.tools.mcp_configs}"
    # demonstrations played through another file find the same server names there
    for demo in (recipe.sft.demos if recipe.sft else []):
        if demo.mcp_configs:
            files = [str((recipe.base_dir / f).resolve()) for f in demo.mcp_configs]
            other = load_recipe_servers(recipe.tools.model_copy(update={"mcp_configs": files}))
            assert set(other) == set(servers), (path.name, demo.name, files)
