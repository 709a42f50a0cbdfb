"""`rlfactory train` end to end on a tiny real model with the real calculator MCP server (CLI smoke), the run folder
it leaves, `report`, `eval` with pass@k, and kill -9 / --resume giving the same metrics as an unbroken run."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from run_metrics import assert_same_metrics, rows_of

STEPS = 4


def rlf(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rlfactory.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def straight_run(tiny_setup_master, tmp_path_factory) -> Path:
    """One unbroken CLI run of STEPS steps (checkpoint every step)."""
    out = tmp_path_factory.mktemp("straight") / "run"
    proc = rlf("train", str(tiny_setup_master / "recipe.yaml"), "--output-dir", str(out),
               "--set", f"trainer.total_steps={STEPS}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return out


def test_cli_train_leaves_a_complete_run_folder(straight_run):
    rows = rows_of(straight_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for key in ["reward/mean", "reward/exact_match", "reward/digit_share", "reward/errors", "rollout/trajectories",
                "rollout/finish_stop", "tools/cache_hit_rate", "tools/calls", "loss/pg", "loss/entropy",
                "loss/grad_norm", "perf/rollout_s", "perf/reward_s", "perf/update_s", "perf/tokens_per_s"]:
        assert key in rows[0], key
    assert rows[0]["rollout/trajectories"] == 2 * 4
    assert any(r["loss/grad_norm"] > 0 for r in rows)  # the update really trained something
    summary = json.loads((straight_run / "summary.json").read_text())
    assert summary["steps"] == STEPS and len(summary["rewards"]) == STEPS
    first, last = summary["rewards"][:5], summary["rewards"][-5:]
    assert summary["reward_rise"] == pytest.approx(sum(last) / len(last) - sum(first) / len(first))
    assert list((straight_run / "tensorboard").glob("events.out.tfevents.*"))
    assert (straight_run / "reward_curve.png").stat().st_size > 1000
    html = (straight_run / "transcripts.html").read_text()
    assert html.count('class="traj"') == 2 * STEPS  # transcripts_per_step: 2
    assert (straight_run / "checkpoints" / "latest").read_text() == f"step_{STEPS:06d}"
    assert (straight_run / "checkpoints" / f"step_{STEPS:06d}" / "model" / "config.json").is_file()
    assert (straight_run / "recipe.yaml").is_file()
    assert not list(straight_run.glob("charts_*.png"))  # the charts are `report`'s: training's end skips them


def test_report_regenerates_plot_and_viewer(straight_run):
    (straight_run / "reward_curve.png").unlink()
    (straight_run / "transcripts.html").unlink()
    proc = rlf("report", str(straight_run), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (straight_run / "reward_curve.png").is_file() and (straight_run / "transcripts.html").is_file()
    assert "token ids only" not in (straight_run / "transcripts.html").read_text()  # the run's tokenizer was found
    # the dashboard's charts as PNGs, one per section with data (a synchronous run has no staleness section)
    charts = sorted(p.name for p in straight_run.glob("charts_*.png"))
    assert charts == ["charts_learning.png", "charts_perf.png", "charts_shape.png", "charts_tools.png"]
    for name in charts:
        assert (straight_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {straight_run / name}" in \
            proc.stdout.replace("\n", "")
    bad = rlf("report", str(straight_run.parent / "nope"), timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_eval_reports_pass_at_k_and_saves_transcripts(straight_run, tiny_setup_master, tmp_path):
    ckpt = straight_run / "checkpoints" / f"step_{STEPS:06d}"
    proc = rlf("eval", str(tiny_setup_master / "recipe.yaml"), "--checkpoint", str(ckpt), "--k", "2",
               "--output-dir", str(tmp_path / "ev"), "--set", "data.max_val_tasks=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "ev" / "eval" / "eval.json").read_text())
    assert res["tasks"] == 4 and res["k"] == 2
    assert 0.0 <= res["pass@1"] <= res["pass@2"] <= 1.0
    assert math.isfinite(res["reward/mean"])
    lines = (tmp_path / "ev" / "eval" / "eval.jsonl").read_text().splitlines()
    assert len(lines) == 4 * 2
    assert "pass@2" in proc.stdout


def test_resume_after_kill_gives_the_same_metrics(straight_run, tiny_setup_master, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(tiny_setup_master / "recipe.yaml"), "--output-dir",
           str(out), "--set", f"trainer.total_steps={STEPS}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    latest = out / "checkpoints" / "latest"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if latest.is_file() and latest.read_text() == "step_000002":
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its tool-server children, like kill -9 on the job
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert not (out / "summary.json").exists()
    resumed = rlf("train", str(tiny_setup_master / "recipe.yaml"), "--output-dir", str(out), "--resume",
                  "--set", f"trainer.total_steps={STEPS}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 2
    a, b = rows_of(straight_run), rows_of(out)
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        assert_same_metrics(ra, rb)
    assert summary["rewards"] == pytest.approx(json.loads((straight_run / "summary.json").read_text())["rewards"])


def test_resume_without_a_checkpoint_starts_fresh_and_a_bad_override_starts_nothing(tiny_setup_master, tmp_path):
    bad = rlf("train", str(tiny_setup_master / "recipe.yaml"), "--output-dir", str(tmp_path / "r"),
              "--set", "trainer.total_stepz=1", timeout=120)
    assert bad.returncode != 0 and "did you mean 'total_steps'" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "r").exists()
    rec = yaml.safe_load((tiny_setup_master / "recipe.yaml").read_text())
    assert rec["trainer"]["total_steps"] >= 1


def test_an_existing_run_is_never_replaced_by_accident(straight_run, tiny_setup_master):
    before = (straight_run / "metrics.jsonl").read_bytes()
    ckpts = sorted(p.name for p in (straight_run / "checkpoints").iterdir())
    again = rlf("train", str(tiny_setup_master / "recipe.yaml"), "--output-dir", str(straight_run), timeout=120)
    assert again.returncode != 0 and "Traceback" not in again.stderr
    msg = " ".join(again.stderr.split())
    assert "already holds a run" in msg and "--resume" in msg and "--overwrite" in msg, again.stderr
    assert (straight_run / "metrics.jsonl").read_bytes() == before
    assert sorted(p.name for p in (straight_run / "checkpoints").iterdir()) == ckpts
    from rlfactory.api import train
    from rlfactory.errors import RLFactoryError
    from rlfactory.recipe.schema import Recipe

    with pytest.raises(RLFactoryError, match="--overwrite"):
        train(Recipe.from_yaml(tiny_setup_master / "recipe.yaml", [f"trainer.output_dir={straight_run}"]))


def test_resume_applies_the_changes_it_can_and_refuses_the_rest(straight_run, tiny_setup_master, tmp_path):
    import shutil

    from rlfactory.recipe.schema import Recipe

    out = tmp_path / "run"
    shutil.copytree(straight_run, out)  # a run folder moved elsewhere is still its run
    recipe = str(tiny_setup_master / "recipe.yaml")
    before = (out / "metrics.jsonl").read_bytes()
    refused = rlf("train", recipe, "--output-dir", str(out), "--resume", "--set", "trainer.seed=7",
                  "--set", "rollout.sampling.temperature=0.5", "--set", f"trainer.total_steps={STEPS + 1}",
                  "--set", "data.skip_settled_epochs=2", timeout=120)
    msg = " ".join(refused.stderr.split())
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert ("trainer.seed: 0 -> 7 (the remaining steps' prompts and sampling seeds come from the saved run's seed)"
            in msg)
    assert "rollout.sampling.temperature: 1.0 -> 0.5 (it changes what the run trains on" in msg
    assert ("data.skip_settled_epochs: 0 -> 2 (the checkpoint's sampler set tasks aside for the saved number of "
            "epochs" in msg)
    assert "nothing was started" in msg
    assert "trainer.total_steps" not in msg  # that one a resume can apply
    assert (out / "metrics.jsonl").read_bytes() == before and not (out / "resumes.jsonl").exists()

    applied = rlf("train", recipe, "--output-dir", str(out), "--resume", "--set", f"trainer.total_steps={STEPS + 1}",
                  "--set", "algorithm.learning_rate=0.0123")
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert "trainer.total_steps: 4 -> 5" in " ".join(applied.stderr.split())
    rows = rows_of(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 2))
    assert rows[-2]["loss/lr"] == pytest.approx(1e-3) and rows[-1]["loss/lr"] == pytest.approx(0.0123)
    record = [json.loads(ln) for ln in (out / "resumes.jsonl").read_text().splitlines()]
    assert record == [{"step": STEPS, "changes": {"algorithm.learning_rate": [1e-3, 0.0123],
                                                  "trainer.output_dir": [str(straight_run), str(out)],
                                                  "trainer.total_steps": [STEPS, STEPS + 1]}}]
    now = Recipe.from_yaml(out / "recipe.yaml")
    assert now.trainer.total_steps == STEPS + 1 and now.algorithm.learning_rate == 0.0123


def test_an_unreachable_http_tool_server_is_found_before_anything_starts(tiny_setup_master, tmp_path):
    import socket

    with socket.socket() as s:  # bound, never listening: nothing accepts connections there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        cfg = tmp_path / "web.json"
        cfg.write_text(json.dumps({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}}))
        out = tmp_path / "run"
        proc = rlf("train", str(tiny_setup_master / "recipe.yaml"), "--output-dir", str(out),
                   "--set", f"tools.mcp_configs=[{cfg}]", "--set", "tools.servers=[web]", timeout=120)
    msg = " ".join(proc.stderr.split())
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    # the config file is named (as a path relative to the working folder when that is shorter)
    assert f"web.json: server 'web' (http://127.0.0.1:{port}/mcp): nothing accepts connections" in msg, msg[-2000:]
    assert not out.exists()  # no empty run folder left behind


def test_sigterm_checkpoints_the_step_and_leaves_no_tool_server(tiny_setup_master, tmp_path):
    import psutil

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(tiny_setup_master / "recipe.yaml"), "--output-dir",
           str(out), "--set", "trainer.total_steps=200", "--set", "trainer.save_every_steps=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        servers = psutil.Process(proc.pid).children(recursive=True)
        assert servers  # the calculator MCP server
        proc.send_signal(signal.SIGTERM)  # the trainer alone, as a cluster's preemption notice
        said, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 143, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and 2 <= summary["steps"] < 200
    assert (out / "checkpoints" / f"step_{summary['steps']:06d}").is_dir()
    assert len(rows_of(out)) == summary["steps"]
    assert "continue with the same command and --resume" in " ".join(said.split())
    psutil.wait_procs(servers, timeout=10)
    assert not [p for p in servers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
