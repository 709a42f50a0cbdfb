"""`rlfactory rollout` as a user runs it: a tiny real setup (trained BPE tokenizer, random tiny Qwen3, the real
calculator MCP server, reward functions), trajectories to JSONL, the HTML viewer beside them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlfactory.rollout.trajectory import Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))


def _rlfactory(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("rlfactory")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rlfactory.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def tiny_recipe(tmp_path_factory) -> Path:
    from tiny_setup import build_tiny_setup

    return build_tiny_setup(tmp_path_factory.mktemp("rollout_cli"))


def test_rollout_writes_trajectories_and_viewer(tiny_recipe, tmp_path):
    out, html = tmp_path / "out" / "rollouts.jsonl", tmp_path / "out" / "view.html"
    proc = _rlfactory("rollout", str(tiny_recipe), "--limit", "3", "--samples", "2", "--out", str(out),
                      "--html", str(html), "--set", "rollout.horizon.turns=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [Trajectory.model_validate(json.loads(line)) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and {r.sample_index for r in rows} == {0, 1}
    for t in rows:
        assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs) and t.turns
        assert t.reward is not None and t.task.get("answer") is not None and t.horizon == 2
    page = html.read_text()
    assert page.count('class="traj"') == 6 and "rollouts" in page
    assert "6 trajectories from 3 tasks" in proc.stdout and "rollout/num_turns_mean" in proc.stdout


def test_rollout_reports_user_errors_without_traceback(tiny_recipe, tmp_path):
    proc = _rlfactory("rollout", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "x.jsonl"), cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "missing.yaml" in proc.stderr
    proc = _rlfactory("rollout", str(tiny_recipe), "--out", str(tmp_path / "x.jsonl"), "--split", "test",
                      cwd=tmp_path)
    assert proc.returncode != 0 and "--split" in proc.stderr and "Traceback" not in proc.stderr
