"""`trainer.loggers`: a real quickstart run logs to wandb (offline) and MLflow (file store); both are read back through
their own libraries and hold exactly the numbers of metrics.jsonl. And the recipe checks around the list."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_records import history, run_info

from rlfactory.errors import RLFactoryError
from rlfactory.preflight import check_recipe
from rlfactory.recipe.schema import Recipe
from rlfactory.report.metrics import read_metrics
from rlfactory.report.trackers import missing_packages
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory
from rlfactory.verl.run_folder import VERL_NAMES, verl_step_row

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "recipes" / "quickstart.yaml"


def _numbers(row: dict) -> dict[str, float]:
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def test_wandb_offline_and_mlflow_file_store_hold_the_metrics_of_metrics_jsonl(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'rlfactory[trackers]')")
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env["WANDB_SILENT"] = "true"
    proc = subprocess.run(
        [sys.executable, "-m", "rlfactory.cli", "train", str(QUICKSTART), "--output-dir", str(run),
         "--set", "trainer.total_steps=2", "--set", "trainer.loggers=[jsonl, tensorboard, wandb, mlflow]",
         "--set", "trainer.tracking.project=rlf-test", "--set", "trainer.tracking.tags=[quickstart, ci]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    ids = json.loads((run / "trackers.json").read_text())
    assert (run / "tensorboard").is_dir()

    # wandb: the offline run's own records (wandb's protobuf schema), one history entry per step
    [wb_file] = list((run / "wandb").glob(f"offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb"))
    info = run_info(wb_file)
    assert (info.project, info.display_name, sorted(info.tags)) == ("rlf-test", "run", ["ci", "quickstart"])
    logged = history(wb_file)
    for row in rows:
        ours = _numbers(row)
        theirs = {k: v for k, v in logged[row["step"]].items() if not k.startswith("_")}
        assert theirs == pytest.approx(ours, rel=0, abs=0), row["step"]
        assert "tools/calculator/calls" in theirs and "loss/pg" in theirs

    # MLflow: its client over the run folder's file store
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    exp = client.get_experiment_by_name("rlf-test")
    [found] = client.search_runs([exp.experiment_id])
    assert found.info.run_id == ids["mlflow"] and found.info.run_name == "run"
    assert found.info.status == "FINISHED"
    assert {"quickstart", "ci"} <= set(found.data.tags)
    assert found.data.params["trainer.total_steps"] == "2"
    for key in _numbers(rows[0]):
        hist = {m.step: m.value for m in client.get_metric_history(found.info.run_id, key)}
        assert hist == {r["step"]: float(r[key]) for r in rows if key in _numbers(r)}, key


def test_a_logger_whose_package_is_missing_is_a_check_error_naming_the_extra(tmp_path):
    assert missing_packages(["jsonl", "tensorboard", "wandb"]) == []
    if missing_packages(["trackio"]) == []:
        pytest.skip("trackio is installed here: nothing is missing")
    check = check_recipe(QUICKSTART, ["trainer.loggers=[jsonl, trackio]"], for_training=True)
    assert not check.ok
    assert any("trainer.loggers" in e and "`trackio`" in e and "rlfactory[trackio]" in e for e in check.errors)
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "train", str(QUICKSTART), "--output-dir",
                           str(tmp_path / "run"), "--set", "trainer.loggers=[trackio]"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "rlfactory[trackio]" in proc.stderr and "nothing was started" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_loggers_default_to_jsonl_and_tensorboard_and_conflicts_are_errors():
    r = Recipe.from_yaml(QUICKSTART)
    assert r.trainer.effective_loggers() == ["jsonl", "tensorboard"]
    r = Recipe.from_yaml(QUICKSTART, overrides=["trainer.log.tensorboard=false"])
    assert r.trainer.effective_loggers() == ["jsonl"]
    # the quickstart sets log.tensorboard: true, so TensorBoard stays on beside the listed trackers
    r = Recipe.from_yaml(QUICKSTART, overrides=["trainer.loggers=[mlflow]"])
    assert r.trainer.effective_loggers() == ["jsonl", "tensorboard", "mlflow"]
    r = Recipe.from_yaml(QUICKSTART, overrides=["trainer.loggers=[mlflow, jsonl]", "trainer.log={}"])
    assert r.trainer.effective_loggers() == ["jsonl", "mlflow"]
    with pytest.raises((RLFactoryError, ValueError), match="disagree about TensorBoard"):
        Recipe.from_yaml(QUICKSTART, overrides=["trainer.loggers=[tensorboard]", "trainer.log.tensorboard=false"])
    with pytest.raises((RLFactoryError, ValueError), match="loggers"):
        Recipe.from_yaml(QUICKSTART, overrides=["trainer.loggers=[jsonl, neptune]"])


def test_a_verl_row_carries_the_local_engines_loss_and_stage_names():
    recipe = Recipe.from_yaml(QUICKSTART)
    verl = {"actor/pg_loss": -0.25, "actor/entropy": 1.5, "actor/ppo_kl": 0.01, "actor/grad_norm": 0.7,
            "timing_s/step": 3.0, "timing_s/gen": 1.0, "critic/score/mean": 0.5,
            "training/off_policy/trajectory_staleness/max": 1}
    row = verl_step_row(recipe, 1, verl, [], {})
    assert (row["loss/pg"], row["loss/entropy"], row["loss/ppo_kl"], row["perf/step_s"]) == (-0.25, 1.5, 0.01, 3.0)
    assert row["async/staleness_traj_max"] == 1  # the dashboard's staleness section shows verl's too
    assert row["actor/pg_loss"] == -0.25  # verl's own names stay
    assert all(ours in row for ours, theirs in VERL_NAMES.items() if theirs in verl)


def test_a_verl_row_counts_the_nodes_that_served_it_and_the_hits_on_the_other_nodes_entries():
    recipe = Recipe.from_yaml(QUICKSTART)

    def record(node: str, index: int, *calls: ToolCallRecord) -> dict:
        traj = Trajectory(id=f"{node}{index}", group_id="g", sample_index=index, prompt_ids=[1], reward=1.0,
                          tool_calls=list(calls))
        return {"trajectory": traj.model_dump(), "node": node, "worker": 1, "horizon": 3, "global_step": 1}

    def call(origin: str | None) -> ToolCallRecord:
        return ToolCallRecord(turn=0, name="calculator", result="42", cached=origin is not None, cache_origin=origin)

    both = [record("a", 0, call(None)), record("b", 1, call("a")), record("b", 2, call("b")), record("a", 3, call("b"))]
    row = verl_step_row(recipe, 1, {}, both, {})
    assert (row["rollout/nodes"], row["tools/cache_hits"], row["tools/cache_hits_from_other_nodes"]) == (2, 3, 2)
    one = verl_step_row(recipe, 2, {}, both[1:3], {})
    assert (one["rollout/nodes"], one["tools/cache_hits"], one["tools/cache_hits_from_other_nodes"]) == (1, 2, 1)
