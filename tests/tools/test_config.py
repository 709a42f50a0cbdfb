"""Loading `mcpServers` files: path resolution against the config file, the interpreter substitution, settings,
and one clear error naming the file and field for every kind of mistake."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlfactory.errors import ConfigError
from rlfactory.recipe.tools import ToolsConfig
from rlfactory.tools.mcp_configs import load_mcp_config, load_mcp_configs, load_recipe_servers

TOOLBOX = Path(__file__).parent / "servers" / "toolbox.py"


def write(path: Path, servers: dict, **top) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **top}))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_mcp_config(path)
    return str(e.value)


def test_stdio_server_resolves_against_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "proj" / "envs").mkdir(parents=True)
    (tmp_path / "proj" / "envs" / "t.py").write_text("")
    cfg = write(tmp_path / "proj" / "configs" / "a.json", {
        "here": {"command": "python", "args": ["../envs/t.py"]},
        "there": {"command": "python3", "args": ["envs/t.py", "--flag"], "cwd": "..", "env": {"K": "v", "N": 3}},
    })
    monkeypatch.chdir(tmp_path)  # somewhere else: must not matter
    servers = load_mcp_config(cfg)
    here, there = servers["here"], servers["there"]
    assert here.transport == "stdio" and here.command == sys.executable
    assert here.cwd == str((tmp_path / "proj" / "configs").resolve())
    assert here.args == ("../envs/t.py",)
    assert there.cwd == str((tmp_path / "proj").resolve())
    assert there.args == ("envs/t.py", "--flag") and there.env == {"K": "v", "N": "3"}
    assert there.settings.max_concurrency == 32  # defaults when no "rlfactory" key


def test_http_server_and_rlfactory_settings(tmp_path):
    cfg = write(tmp_path / "h.json", {"remote": {
        "url": "http://127.0.0.1:8931/mcp", "headers": {"Authorization": "Bearer x"}, "type": "http",
        "rlfactory": {"max_concurrency": 4, "rate_per_s": 2.5, "tool_timeout_s": 3, "cache": False,
                      "cache_ttl_s": None, "sessions": 2}}})
    s = load_mcp_config(cfg)["remote"]
    assert s.transport == "http" and s.url == "http://127.0.0.1:8931/mcp"
    assert s.headers == {"Authorization": "Bearer x"}
    st = s.settings
    assert (st.max_concurrency, st.rate_per_s, st.tool_timeout_s, st.cache, st.cache_ttl_s, st.sessions) == \
        (4, 2.5, 3.0, False, None, 2)


def test_command_on_path_and_disabled_servers(tmp_path):
    cfg = write(tmp_path / "c.json", {
        "sh": {"command": "sh", "args": ["-c", "true"]},
        "off": {"command": "definitely-not-installed-xyz", "disabled": True},
    })
    servers = load_mcp_config(cfg)
    assert list(servers) == ["sh"] and Path(servers["sh"].command).name == "sh"


def test_unknown_key_names_file_field_and_suggestion(tmp_path):
    cfg = write(tmp_path / "x.json", {"search": {"comand": "python"}})
    msg = error_of(cfg)
    assert "x.json" in msg
    assert "mcpServers.search.comand: unknown key (did you mean 'command'?)" in msg


def test_unknown_rlfactory_setting_and_bad_value(tmp_path):
    cfg = write(tmp_path / "s.json", {"a": {"command": "python", "rlfactory": {"max_concurency": 3}},
                                      "b": {"command": "python", "rlfactory": {"tool_timeout_s": -1}}})
    msg = error_of(cfg)
    assert "2 problems" in msg
    assert "mcpServers.a.rlfactory.max_concurency: unknown key (did you mean 'max_concurrency'?)" in msg
    assert "mcpServers.b.rlfactory.tool_timeout_s:" in msg and "greater than 0" in msg


def test_missing_command_and_missing_script(tmp_path):
    msg = error_of(write(tmp_path / "m.json", {"x": {"command": "no-such-binary-rlf"}}))
    assert "mcpServers.x.command: 'no-such-binary-rlf' not found on PATH" in msg
    msg = error_of(write(tmp_path / "r.json", {"x": {"command": "./bin/server"}}))
    assert "mcpServers.x.command: './bin/server' not found relative to cwd" in msg
    msg = error_of(write(tmp_path / "p.json", {"x": {"command": "python", "args": ["envs/tools/nope.py"]}}))
    assert "mcpServers.x.args[0]: file 'envs/tools/nope.py' not found" in msg
    msg = error_of(write(tmp_path / "d.json", {"x": {"command": "python", "cwd": "missing-dir"}}))
    assert "mcpServers.x.cwd: directory" in msg and "does not exist" in msg


@pytest.mark.parametrize("url", ["localhost:8000/mcp", "ftp://127.0.0.1/mcp", "http://", 42])
def test_bad_url(tmp_path, url):
    msg = error_of(write(tmp_path / "u.json", {"web": {"url": url}}))
    assert "mcpServers.web.url:" in msg and "is not an http(s) URL" in msg


def test_shape_errors(tmp_path):
    both = error_of(write(tmp_path / "b.json", {"x": {"command": "python", "url": "http://127.0.0.1:1/mcp"}}))
    assert "mcpServers.x: has both 'command' and 'url'" in both
    neither = error_of(write(tmp_path / "n.json", {"x": {"args": []}}))
    assert "mcpServers.x: needs 'command'" in neither
    mixed = error_of(write(tmp_path / "mx.json", {"x": {"url": "http://127.0.0.1:1/mcp", "args": ["a"]}}))
    assert "mcpServers.x.args: only valid with 'command'" in mixed
    sse = error_of(write(tmp_path / "sse.json", {"x": {"url": "http://127.0.0.1:1/sse", "type": "sse"}}))
    assert "mcpServers.x.type: 'sse' is not supported" in sse
    dotted = error_of(write(tmp_path / "dot.json", {"a.b": {"command": "python"}}))
    assert "server names must be non-empty, without dots" in dotted
    top = error_of(write(tmp_path / "top.json", {}, mcpServer={}))
    assert "mcpServer: unknown key (did you mean 'mcpServers'?)" in top
    (tmp_path / "nokey.json").write_text('{"servers": {}}')
    assert 'top level must be an object with an "mcpServers" key' in error_of(tmp_path / "nokey.json")


def test_invalid_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {"x": {"command": "python",}}}')
    msg = error_of(bad)
    assert "bad.json" in msg and "invalid JSON at line 1 column" in msg
    assert "file not found" in error_of(tmp_path / "absent.json")


def test_every_problem_in_one_error(tmp_path):
    cfg = write(tmp_path / "many.json", {"a": {"comand": "python"}, "b": {"url": "nope"},
                                         "c": {"command": "python", "args": "x.py"}})
    with pytest.raises(ConfigError) as e:
        load_mcp_config(cfg)
    assert len(e.value.problems) >= 3 and e.value.file is not None and e.value.file.endswith("many.json")


def test_duplicate_names_across_files(tmp_path):
    a = write(tmp_path / "a.json", {"calc": {"command": "python", "args": [str(TOOLBOX)]}})
    b = write(tmp_path / "b.json", {"calc": {"command": "python", "args": [str(TOOLBOX)]}})
    with pytest.raises(ConfigError) as e:
        load_mcp_configs([a, b])
    msg = str(e.value)
    assert "b.json" in msg and "a.json" in msg and "mcpServers.calc: server name already defined" in msg


def test_a_name_defined_twice_in_one_file_is_reported_with_its_lines(tmp_path):
    """JSON parsers keep the last of two equal keys without a word: the first server would vanish."""
    cfg = tmp_path / "twice.json"
    entry = json.dumps({"command": "python", "args": [str(TOOLBOX)]})
    cfg.write_text('{"mcpServers": {\n  "calc": ' + entry + ',\n  "other": ' + entry + ',\n  "calc": ' + entry
                   + "\n}}")
    msg = error_of(cfg)
    assert "twice.json" in msg and "mcpServers.calc: defined more than once in this file (lines 2, 4)" in msg
    assert "mcpServers.other" not in msg


def test_identity_changes_with_the_launch_command(tmp_path):
    a = load_mcp_config(write(tmp_path / "a.json", {"s": {"command": "python", "args": [str(TOOLBOX)]}}))["s"]
    b = load_mcp_config(write(tmp_path / "b.json", {"s": {"command": "python", "args": [str(TOOLBOX), "--x"]}}))["s"]
    assert a.identity() != b.identity()
    assert a.identity() == load_mcp_config(tmp_path / "a.json")["s"].identity()


def test_shipped_default_config_is_valid(repo_root):
    servers = load_mcp_config(repo_root / "mcp_configs" / "default.json")
    assert set(servers) == {"calculator", "search", "python"}
    for name, s in servers.items():
        # run as modules of the installed package, so the file works from a checkout and from a wheel alike
        assert s.command == sys.executable and s.cwd == str((repo_root / "mcp_configs").resolve())
        assert s.args[0] == "-m" and s.args[1].startswith("rlfactory.envs.tools.")


def test_a_recipe_picks_servers_of_a_shared_file_and_changes_their_settings(repo_root):
    shared = str(repo_root / "mcp_configs" / "default.json")
    servers = load_recipe_servers(ToolsConfig(mcp_configs=[shared], servers=["calculator", "python"],
                                              server_settings={"python": {"max_concurrency": 16, "sessions": 2}}))
    assert list(servers) == ["calculator", "python"]
    python = servers["python"].settings
    assert (python.max_concurrency, python.sessions) == (16, 2)
    assert python.tool_timeout_s == 30 and python.cache is False  # the file's values, where the recipe says nothing
    assert servers["calculator"].settings.max_concurrency == 64
    assert set(load_recipe_servers(ToolsConfig(mcp_configs=[shared]))) == {"calculator", "search", "python"}


def test_unknown_servers_in_a_recipe_are_named_with_a_suggestion(repo_root):
    shared = str(repo_root / "mcp_configs" / "default.json")
    with pytest.raises(ConfigError) as e:
        load_recipe_servers(ToolsConfig(mcp_configs=[shared], servers=["calculater"],
                                        server_settings={"serch": {"sessions": 2}}))
    assert e.value.problems[0].startswith("tools.servers: no server 'calculater'")
    assert "did you mean 'calculator'?" in e.value.problems[0]
    assert e.value.problems[1].startswith("tools.server_settings.serch: no such server")


def test_a_recipe_adds_arguments_to_a_command_server_and_refuses_them_for_a_url_server(repo_root, tmp_path):
    shared = str(repo_root / "mcp_configs" / "default.json")
    file_args = load_recipe_servers(ToolsConfig(mcp_configs=[shared]))["python"].args
    tools = ToolsConfig(mcp_configs=[shared], server_args={"python": ["--limit", 3]})  # YAML's numbers become text
    servers = load_recipe_servers(tools)
    assert servers["python"].args == (*file_args, "--limit", "3")
    assert servers["calculator"].args == load_recipe_servers(ToolsConfig(mcp_configs=[shared]))["calculator"].args
    remote = write(tmp_path / "r.json", {"far": {"url": "http://127.0.0.1:9/mcp"}})
    with pytest.raises(ConfigError) as e:
        load_recipe_servers(ToolsConfig(mcp_configs=[shared, str(remote)], servers=["python", "far"],
                                        server_args={"far": ["-v"], "pyton": ["-v"]}))
    assert e.value.problems[0].startswith("tools.server_args.far: far is reached at a url (http://127.0.0.1:9/mcp)")
    assert e.value.problems[1].startswith("tools.server_args.pyton: no such server among those used (python, far)")


def test_a_module_server_that_python_cannot_find_is_reported(tmp_path):
    cfg = write(tmp_path / "m.json", {"ghost": {"command": "python", "args": ["-m", "rlfactory.envs.tools.nope"]},
                                      "fine": {"command": "python", "args": ["-m", "rlfactory.envs.tools.calculator"]}})
    msg = error_of(cfg)
    assert "mcpServers.ghost.args: `python -m rlfactory.envs.tools.nope`: no such module" in msg and "fine" not in msg


def test_the_default_is_default_json_alone_even_beside_files_that_clash(tmp_path, monkeypatch):
    """In a project laid out like the checkout, a command given no file reads mcp_configs/default.json only: the
    other files define the same server names for other recipes (`textcraft` in envs.json and agentgym_tasks.json)."""
    from rlfactory.tools.mcp_configs import default_config_paths
    from rlfactory.tools.setup_mcp import resolve_config_paths

    entry = {"command": "python", "args": [str(TOOLBOX)]}
    write(tmp_path / "mcp_configs" / "default.json", {"tb": entry})
    write(tmp_path / "mcp_configs" / "envs.json", {"textcraft": entry})
    write(tmp_path / "mcp_configs" / "agentgym_tasks.json", {"textcraft": entry})
    assert default_config_paths(tmp_path) == [tmp_path / "mcp_configs" / "default.json"]
    monkeypatch.chdir(tmp_path)
    assert resolve_config_paths([]) == [Path("mcp_configs/default.json")]
    assert set(load_mcp_configs(resolve_config_paths([]))) == {"tb"}
    # files given by name are read as given, and clashing names there are still an error naming both files
    with pytest.raises(ConfigError, match="already defined in"):
        load_mcp_configs(resolve_config_paths(["mcp_configs/envs.json", "mcp_configs/agentgym_tasks.json"]))


def test_a_project_without_default_json_is_told_which_files_it_has(tmp_path, monkeypatch):
    from rlfactory.tools.mcp_configs import default_config_paths
    from rlfactory.tools.setup_mcp import resolve_config_paths

    write(tmp_path / "mcp_configs" / "mine.json", {"tb": {"command": "python", "args": [str(TOOLBOX)]}})
    with pytest.raises(ConfigError) as e:
        default_config_paths(tmp_path)
    assert "holds no default.json" in str(e.value) and "-c " in str(e.value) and "mine.json" in str(e.value)
    assert default_config_paths(tmp_path / "elsewhere") == []  # no mcp_configs/ at all: the caller's fallback
    monkeypatch.chdir(tmp_path / "mcp_configs")  # a folder without mcp_configs/: the shipped default.json
    (shipped,) = resolve_config_paths([])
    assert shipped.name == "default.json" and set(load_mcp_config(shipped)) == {"calculator", "search", "python"}
