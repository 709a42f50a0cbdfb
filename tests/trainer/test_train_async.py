"""Asynchronous training on the local engine (`trainer.max_staleness_steps`), through the CLI on the quickstart
(its warm checkpoint and the real calculator MCP server):
- k = 0 is the synchronous loop: its metrics equal those the loop gave before asynchronous training existed
  (`data/sync_quickstart_3_steps.jsonl`, written by the code of commit 1338d7a under the same seed);
- k >= 1 runs a generator process beside the trainer: staleness never exceeds k, every async/off-policy metric is
  logged, and no process outlives the run; both stale-group policies (drop, wait) and masking;
- kill -9 of the trainer alone takes the generator and its tool servers down with it, and --resume finishes the run
  with each step logged once;
- a failure inside the generator stops the run with a clear error.
Processes a run started are found by a marker in their environment (children inherit it)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from run_metrics import assert_same_metrics, rows_of

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "quickstart.yaml"
GOLDEN = Path(__file__).parent / "data" / "sync_quickstart_3_steps.jsonl"
SMALL = ["trainer.prompts_per_step=4", "rollout.samples_per_prompt=4", "trainer.log.tensorboard=false"]
pytestmark = pytest.mark.timeout(600)


def marked_env(marker: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "RLF_TEST_MARKER": marker}


def processes_with(marker: str) -> list[int]:
    """pids of live processes whose environment holds the marker."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"RLF_TEST_MARKER={marker}".encode() in (d / "environ").read_bytes().split(b"\0"):
                stat = (d / "stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":  # zombies have exited
                    found.append(int(d.name))
        except OSError:
            continue
    return found


def wait_gone(marker: str, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def train(out: Path, *sets: str, marker: str | None = None, resume: bool = False) -> subprocess.CompletedProcess:
    marker = marker or uuid.uuid4().hex
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(RECIPE), "--output-dir", str(out)]
    if resume:
        cmd.append("--resume")
    for s in (*SMALL, *sets):
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=marked_env(marker), cwd=REPO)
    assert not wait_gone(marker), "processes of the run outlived it"
    return proc


def test_k0_gives_the_metrics_of_the_synchronous_loop_before_async_existed(tmp_path):
    import torch

    made_on = json.loads(GOLDEN.with_suffix(".machine.json").read_text())
    here = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if any(made_on[k] != v for k, v in here.items()):  # other kernels sum floats in another order: other samples
        pytest.skip(f"the golden metrics were made with {made_on['torch']} on {made_on['cpu_capability']}, "
                    f"this is {here['torch']} on {here['cpu_capability']}")
    out = tmp_path / "run"
    # the prefix cache and the shared prompt forward came later: the same maths in another float order
    proc = train(out, "trainer.total_steps=3", "trainer.save_every_steps=0", "trainer.log.transcripts_per_step=0",
                 "trainer.max_staleness_steps=0", "rollout.prefix_cache=false", "algorithm.shared_prompt_forward=false",
                 "rollout.tool_error_max_tokens=32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    golden = [json.loads(ln) for ln in GOLDEN.read_text().splitlines() if ln.strip()]
    rows = rows_of(out)
    assert len(rows) == len(golden) == 3
    for got, want in zip(rows, golden):
        assert not any(k.startswith(("async/", "off_policy/")) for k in rows[0])
        assert set(want) <= set(got), set(want) - set(got)
        assert_same_metrics({k: got[k] for k in want}, want)  # metrics added since are new keys only


def _check_async_rows(rows: list[dict], steps: int, k: int) -> None:
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        for key in ["async/staleness_token_mean", "async/staleness_token_max", "async/staleness_traj_mean",
                    "async/staleness_traj_max", "async/versions_per_trajectory_max", "async/dropped_trajectories",
                    "async/weight_push_s", "async/weight_load_s", "async/trainer_idle_s", "async/generator_idle_s",
                    "async/policy_version", "off_policy/logprob_gap", "off_policy/kl", "off_policy/tokens_clipped",
                    "off_policy/tokens_masked", "reward/mean", "loss/pg", "tools/calls", "rollout/trajectories"]:
            assert key in r, key
        assert 0 <= r["async/staleness_token_max"] <= k and r["async/staleness_traj_max"] <= k
        assert r["async/policy_version"] == r["step"] - 1
        assert r["async/weight_push_s"] > 0 and r["rollout/trajectories"] == 16
        assert r["async/trainer_idle_s"] == pytest.approx(
            r["async/trainer_wait_groups_s"] + r["async/trainer_wait_jobs_s"])  # idle, split by what it waited for
    # the generator ran ahead: some step trained tokens of an older policy
    assert max(r["async/staleness_token_max"] for r in rows) >= 1
    assert sum(r["async/weight_loads"] for r in rows) >= 1  # (reported with the groups, so it lags the pushes)


def test_async_run_drops_nothing_past_the_bound_and_leaves_a_complete_run_folder(tmp_path):
    out = tmp_path / "run"
    proc = train(out, "trainer.total_steps=6", "trainer.save_every_steps=3", "trainer.max_staleness_steps=1",
                 "trainer.log.transcripts_per_step=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rows = rows_of(out)
    _check_async_rows(rows, 6, 1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["max_staleness_steps"] == 1
    assert summary["dropped_trajectories"] == sum(r["async/dropped_trajectories"] for r in rows)
    assert (out / "checkpoints" / "latest").read_text() == "step_000006"
    assert len(list((out / "transcripts").glob("step_*.jsonl"))) == 6
    versions = [json.loads(ln)["policy_versions"] for f in (out / "transcripts").glob("*.jsonl")
                for ln in f.read_text().splitlines()]
    policy = [[x for x in v if x >= 0] for v in versions]  # tool tokens carry -1
    assert policy and all(b >= a for v in policy for a, b in zip(v, v[1:]))  # monotonic within a trajectory
    # step s trains tokens of versions s-1 and s: the generator really loaded the pushed weights
    assert max(max(v) for v in policy if v) >= 4
    report = subprocess.run([sys.executable, "-m", "rlfactory.cli", "report", str(out)], capture_output=True,
                            text=True, timeout=240)
    assert report.returncode == 0, report.stderr[-2000:]


def test_wait_policy_with_masking_at_k2(tmp_path):
    out = tmp_path / "run"
    proc = train(out, "trainer.total_steps=4", "trainer.save_every_steps=0", "trainer.max_staleness_steps=2",
                 "trainer.stale_groups=wait", "algorithm.off_policy.mask_outside=[0.5,2.0]",
                 "trainer.log.transcripts_per_step=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(out)
    _check_async_rows(rows, 4, 2)
    assert all(r["async/dropped_trajectories"] == 0 for r in rows)  # wait never drops
    # masking removes tokens from training: what is trained is what the correction saw, less what it masked
    assert all(r["off_policy/tokens"] - r["off_policy/tokens_masked"] == r["rollout/trained_tokens"] for r in rows)


def test_kill_9_of_the_trainer_takes_the_generator_down_and_resume_finishes_the_run(tmp_path):
    out = tmp_path / "run"
    marker = uuid.uuid4().hex
    sets = ["trainer.total_steps=5", "trainer.save_every_steps=1", "trainer.max_staleness_steps=1",
            "trainer.log.transcripts_per_step=0"]
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(RECIPE), "--output-dir", str(out)]
    for s in (*SMALL, *sets):
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=marked_env(marker))
    latest = out / "checkpoints" / "latest"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if latest.is_file() and latest.read_text() == "step_000002":
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        assert len(processes_with(marker)) >= 3  # trainer, generator, the generator's calculator server
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the trainer alone: its children must notice and leave
        proc.wait(30)
    assert not wait_gone(marker), "the generator or its tool servers outlived a kill -9 of the trainer"
    assert not (out / "summary.json").exists()
    resumed = train(out, *sets, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 2 and summary["steps"] == 5
    rows = rows_of(out)
    _check_async_rows(rows, 5, 1)  # each step once, in order


def test_a_generator_failure_stops_the_run_with_a_clear_error(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"mcpServers": {"calculator": {
        "command": sys.executable, "args": ["-c", "import sys; sys.exit('calculator: no such database')"]}}}))
    out = tmp_path / "run"
    proc = train(out, "trainer.total_steps=2", "trainer.max_staleness_steps=1", f"tools.mcp_configs=[{broken}]")
    assert proc.returncode != 0
    assert "generator process failed" in proc.stderr and "calculator" in proc.stderr, proc.stderr[-3000:]
    assert not (out / "summary.json").exists()
