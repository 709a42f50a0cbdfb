"""The starter project: shipped recipes found by name, `rlfactory init` copying a project that validates, copies that
never overwrite by accident, `pkg://` paths, old config paths and missing extras that name what to do."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory.errors import MissingExtra, RLFactoryError, import_extra
from rlfactory.preflight import check_recipe
from rlfactory.recipe.schema import package_path
from rlfactory.starter import copy_starter, find_recipe, shipped_recipes, starter_root

REPO = Path(__file__).resolve().parents[2]


def rlf(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlfactory.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_recipes_are_found_by_name_and_files_win(tmp_path, monkeypatch):
    assert starter_root() == REPO  # a checkout: the repository's own folders
    assert shipped_recipes()["quickstart"] == REPO / "recipes" / "quickstart.yaml"
    monkeypatch.chdir(tmp_path)
    assert find_recipe("quickstart") == REPO / "recipes" / "quickstart.yaml"
    assert find_recipe("quickstart.yaml") == REPO / "recipes" / "quickstart.yaml"
    (tmp_path / "quickstart").write_text("name: mine\n")  # a file of that name is the user's own recipe
    assert find_recipe("quickstart") == Path("quickstart")
    assert find_recipe("sub/quickstart.yaml") == Path("sub/quickstart.yaml")  # a path is never a name


def test_init_copies_a_project_whose_recipes_validate_and_never_overwrites(tmp_path):
    written = copy_starter(tmp_path / "proj")
    assert (tmp_path / "proj" / "recipes" / "quickstart.yaml") in written
    assert (tmp_path / "proj" / "models" / "quickstart-calc" / "model.safetensors").is_file()
    assert not any(p.suffix == ".py" for p in written)
    check = check_recipe(tmp_path / "proj" / "recipes" / "quickstart.yaml", for_training=True)
    assert check.ok, check.errors
    assert check.recipe.model.path == str(tmp_path / "proj" / "models" / "quickstart-calc")
    # the environment recipes read their task rows from the installed package, so they validate from a copy too
    assert check_recipe(tmp_path / "proj" / "recipes" / "agentgym_textcraft_smoke.yaml").ok
    (tmp_path / "proj" / "recipes" / "quickstart.yaml").write_text("name: edited\n")
    with pytest.raises(RLFactoryError, match="nothing was copied.*--force"):
        copy_starter(tmp_path / "proj")
    assert (tmp_path / "proj" / "recipes" / "quickstart.yaml").read_text() == "name: edited\n"
    copy_starter(tmp_path / "proj", overwrite=True)
    assert (tmp_path / "proj" / "recipes" / "quickstart.yaml").read_text().startswith("# The CPU quickstart")


def test_init_and_names_from_the_command_line(tmp_path):
    made = rlf("init", "proj", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    again = rlf("init", "proj", cwd=tmp_path)
    assert again.returncode == 1 and "--force" in again.stderr and "Traceback" not in again.stderr
    by_name = rlf("validate", "quickstart", cwd=tmp_path)
    assert by_name.returncode == 0 and "quickstart" in by_name.stdout, by_name.stderr
    unknown = rlf("validate", "quickstrat", cwd=tmp_path)
    assert (unknown.returncode == 1 and "the name of a shipped one (" in unknown.stderr
            and "quickstart" in unknown.stderr)
    listed = rlf("recipes", cwd=tmp_path)
    assert listed.returncode == 0 and "agentgym_textcraft_smoke" in listed.stdout


def test_package_paths_name_files_of_installed_packages():
    rows = package_path("pkg://rlfactory.envs.tools/data/tasks/textcraft_train.jsonl")
    assert rows == REPO / "envs" / "tools" / "data" / "tasks" / "textcraft_train.jsonl" and rows.is_file()
    with pytest.raises(RLFactoryError, match="no installed package 'nowhere_pkg'"):
        package_path("pkg://nowhere_pkg/x.jsonl")


def test_an_old_recipes_mcp_path_names_the_shared_file_and_servers(tmp_path):
    text = (REPO / "recipes" / "quickstart.yaml").read_text()
    text = text.replace("mcp_configs: [../mcp_configs/default.json]", "mcp_configs: [mcp/calculator.json]")
    text = text.replace("  servers: [calculator]\n", "").replace("../models", str(REPO / "models"))
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "q.yaml").write_text(text.replace("../data", str(REPO / "data")))
    errors = check_recipe(tmp_path / "recipes" / "q.yaml").errors
    assert any("recipes/mcp/ was merged" in e and "[../mcp_configs/default.json]" in e and "servers: [calculator]" in e
               for e in errors), errors


def test_a_missing_extra_is_named():
    with pytest.raises(MissingExtra, match=r"BabyAI needs the `no_such_simulator` package.*rlfactory\[envs\]"):
        import_extra("no_such_simulator", "BabyAI")
