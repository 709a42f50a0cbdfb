"""CLI smoke tests, run as a user would: `rlfactory setup-mcp`, `rlfactory tools list|call`, `rlfactory new-tool`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_helpers import child_pids, inserted, leftover_children, toolbox_entry, write_config

BIN = Path(sys.executable).parent / "rlfactory"


def rlf(*args: str, cwd: Path | None = None, timeout_s: float = 240) -> subprocess.CompletedProcess:
    cmd = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "rlfactory.cli"]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def toolbox_cfg(tmp_path) -> Path:
    return write_config(tmp_path / "tb.json", {"tb": toolbox_entry()})


def test_setup_mcp_json_report_with_embedded_cache(toolbox_cfg):
    before = child_pids()
    r = rlf("setup-mcp", str(toolbox_cfg), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is True and report["configs"] == [str(toolbox_cfg)]
    (server,) = report["servers"]
    names = {t["name"] for t in server["tools"]}
    assert {"add", "echo", "slow_add", "crash"} <= names
    add = next(t for t in server["tools"] if t["name"] == "add")
    assert add["read_only"] and add["idempotent"] and add["input_schema"]["required"] == ["a", "b"]
    # the probe picked a read-only, idempotent tool and built arguments from its schema
    assert server["probe"]["ok"] and server["probe"]["tool"] in {"add", "echo", "slow_add"}
    assert server["startup_s"] > 0 and server["server_info"]["name"] == "toolbox"
    assert report["cache"]["backend"] == "embedded" and report["cache"]["ok"]
    assert not leftover_children(before)


def test_setup_mcp_reports_an_unhealthy_server(tmp_path):
    cfg = write_config(tmp_path / "mixed.json", {
        "tb": toolbox_entry(),
        "broken": {"command": "python", "args": ["-c", "import sys; sys.stderr.write('missing API key\\n'); "
                                                       "sys.exit(2)"]},
    })
    r = rlf("setup-mcp", str(cfg), "--json", "--cache-backend", "none")
    assert r.returncode == 1
    assert "unhealthy" in r.stderr and "server 'broken'" in r.stderr and "missing API key" in r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is False
    assert {s["name"]: s["ok"] for s in report["servers"]} == {"tb": True, "broken": False}


def test_setup_mcp_rejects_a_bad_config_without_traceback(tmp_path):
    cfg = tmp_path / "typo.json"
    cfg.write_text(json.dumps({"mcpServers": {"search": {"comand": "python"}}}))
    r = rlf("setup-mcp", str(cfg))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "typo.json" in r.stderr and "mcpServers.search.comand: unknown key (did you mean 'command'?)" in r.stderr


def test_tools_list_and_call(toolbox_cfg):
    listed = rlf("tools", "list", str(toolbox_cfg), "--json")
    assert listed.returncode == 0, listed.stderr
    names = {s["function"]["name"] for s in json.loads(listed.stdout)}
    assert {"add", "echo", "fail"} <= names
    ok = rlf("tools", "call", "tb.add", '{"a": 20, "b": 22}', "--config", str(toolbox_cfg), "--json")
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["text"] == "42" and result["server"] == "tb" and not result["is_error"]
    err = rlf("tools", "call", "fail", '{"message": "kaput"}', "-c", str(toolbox_cfg))  # a bare name works too
    assert err.returncode == 1 and "kaput" in err.stdout and "tool_error" in err.stdout
    bad = rlf("tools", "call", "tb.add", "{a: 1}", "-c", str(toolbox_cfg))
    assert bad.returncode == 1 and "arguments: not valid JSON" in bad.stderr and "Traceback" not in bad.stderr


def test_new_tool_scaffold_is_accepted_by_setup_mcp(tmp_path):
    r = rlf("new-tool", "word_count", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    script = tmp_path / "envs" / "tools" / "word_count.py"
    config = tmp_path / "mcp_configs" / "default.json"
    source = script.read_text()
    assert "readOnlyHint=True" in source and "idempotentHint=True" in source and "def word_count(text: str)" in source
    entry = json.loads(config.read_text())["mcpServers"]["word_count"]
    assert entry == {"command": "python", "args": ["envs/tools/word_count.py"], "cwd": ".."}
    # with no CONFIG, setup-mcp checks mcp_configs/default.json; the table names the server and its probe call
    check = rlf("setup-mcp", "--cache-backend", "none", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert "word_count" in check.stdout and "all servers healthy" in check.stdout
    assert "word_count.word_count(text: string) (read-only, idempotent: cached)" in check.stdout
    again = rlf("new-tool", "word_count", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr
    assert script.read_text() == source
    bad = rlf("new-tool", "Bad-Name", cwd=tmp_path)
    assert bad.returncode == 1 and "lowercase letters" in bad.stderr


def test_shipped_default_config_is_healthy(repo_root):
    r = rlf("setup-mcp", "mcp_configs/default.json", "--json", "--cache-backend", "none", cwd=repo_root)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert {s["name"] for s in report["servers"]} == {"calculator", "search", "python"}
    assert all(s["ok"] and s["tools"] for s in report["servers"])


HAND_FORMATTED = """{
  "mcpServers": {
    "calculator": {"command": "python", "args": ["-m", "rlfactory.envs.tools.calculator"],
                   "rlfactory": {"max_concurrency": 64, "tool_timeout_s": 10}},
    "python":     {"command": "python", "args": ["-m", "rlfactory.envs.tools.python_sandbox"],
                   "rlfactory": {"cache": false}}
  },
  "$schema": "https://example.org/mcp-servers.schema.json"
}"""


def test_new_tool_adds_its_entry_and_leaves_a_hand_formatted_config_as_written(tmp_path):
    config = tmp_path / "mcp_configs" / "default.json"
    config.parent.mkdir()
    config.write_text(HAND_FORMATTED)  # compact arrays, aligned values, a key after mcpServers, no final newline
    r = rlf("new-tool", "weather", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    new = config.read_text()
    # its neighbours span lines, so it does too, at their indentation (values compact, as theirs)
    assert inserted(HAND_FORMATTED, new) == (',\n    "weather": {\n      "command": "python",\n'
                                             '      "args": ["envs/tools/weather.py"],\n      "cwd": ".."\n    }')
    assert list(json.loads(new)["mcpServers"]) == ["calculator", "python", "weather"]
    assert (tmp_path / "envs" / "tools" / "weather.py").is_file()


def test_new_tool_refuses_a_config_it_cannot_edit_and_writes_nothing(tmp_path):
    config = tmp_path / "mcp_configs" / "default.json"
    config.parent.mkdir()
    for text, message in [
        ('{"mcpServers": {"weather": {"url": "http://127.0.0.1:9/mcp"}}}', "mcpServers.weather already exists"),
        ('{"mcpServers": {"a": {"url": "http://127.0.0.1:9/mcp"},}}', "invalid JSON at line 1 column"),
    ]:
        config.write_text(text)
        r = rlf("new-tool", "weather", cwd=tmp_path)
        assert r.returncode == 1 and message in r.stderr and "mcp_configs/default.json" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert config.read_text() == text and not (tmp_path / "envs").exists()
