"""Tool schemas that alone fill `rollout.max_context_tokens` (a 2,000-tool server beside the TextCraft environment):
`rlfactory train` refuses before any rollout, with the sizes, the servers with the most tool tokens and the fix.
Without the check every trajectory ended at context_length with no token and the run "succeeded" at reward 0. (The
check sits where the tool side starts, `rollout_side.start_tool_side`, which the asynchronous generator and
verl's workers use too.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from env_outage import REPO, SMOKE, TRACEBACK

MANY_TOOLS = Path(__file__).parent / "servers" / "many_tools.py"
pytestmark = pytest.mark.timeout(300)


def test_tool_schemas_past_the_context_are_refused_before_any_rollout(tmp_path):
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"mcpServers": {"many": {"command": sys.executable,
                                                        "args": [str(MANY_TOOLS), "--tools", "2000"]}}}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(SMOKE), "--output-dir", str(out),
           "--set", f"tools.mcp_configs=[{REPO / 'mcp_configs' / 'envs.json'},{many}]",
           "--set", "tools.servers=[textcraft,many]", "--set", "trainer.total_steps=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and TRACEBACK not in err, err[-3000:]
    m = re.search(r"rollout\.max_context_tokens \((\d+)\) cannot hold the tool schemas: the prompt before any task "
                  r"text is already (\d+) tokens, (\d+) of them the schemas of 2004 tools", err)
    assert m, err[-3000:]
    limit, prompt, schemas = map(int, m.groups())
    assert schemas < prompt and schemas > limit
    assert re.search(r"Most tool tokens: 'many' \d+ tokens \(2000 tools\), 'textcraft' \d+ tokens \(4 tools\)", err)
    assert "tools.servers" in err and "raise rollout.max_context_tokens" in err
    assert not (out / "checkpoints").exists()
    metrics = out / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip()  # no step ran
