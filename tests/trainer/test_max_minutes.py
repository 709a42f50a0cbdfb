"""`trainer.max_minutes`: a wall-clock budget ends the run after the step that spends it, with a checkpoint that
`--resume` continues, in the synchronous and the asynchronous loop."""
from __future__ import annotations

import json

import pytest
from cli_runs import REPO, rlf

RECIPE = REPO / "recipes" / "quickstart.yaml"


@pytest.mark.parametrize("k", [0, 1])
def test_a_spent_budget_stops_the_run_with_a_checkpoint_that_resumes(tmp_path, k):
    out = tmp_path / "run"
    sets = ["--set", "trainer.total_steps=3", "--set", f"trainer.max_staleness_steps={k}",
            "--set", "trainer.save_every_steps=0", "--set", "trainer.log.tensorboard=false"]
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), *sets, "--set", "trainer.max_minutes=0.0001")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped_by"] == "max_minutes"
    assert (out / "checkpoints" / "step_000001").is_dir()
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), *sets, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from_step"] == 1 and "stopped_by" not in summary
