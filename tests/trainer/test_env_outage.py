"""Environment outages through the CLI, as a user meets them: the TextCraft smoke recipe (tiny-random) reaches its
environment server over HTTP, and the test stops that server under the run (env_outage.py).
- a server down for whole steps: those steps are skipped (no update, counted in `rollout/skipped_steps`), and once
  it is back the run trains to its last step; in the synchronous and the asynchronous loop;
- a server that stays down: the run stops after `trainer.max_env_outage_s` with an error naming the server, no
  traceback, a checkpoint, and `--resume` finishes the run once the server is back;
- a server down under only some trajectories of each step: the steps train on the others, as always.
Plus the rule itself (outage.py), and the batch plumbing of a step whose episodes never opened."""
from __future__ import annotations

import pytest
from env_outage import SMOKE, TRACEBACK, HttpTextcraft, TrainRun, smoke_sets, summary_of, write_config

pytestmark = pytest.mark.timeout(600)
SKIPPED = r"step \d+ skipped: all \d+ trajectories failed for infrastructure reasons \(server 'textcraft'"


@pytest.mark.parametrize("async_k", [0, 1], ids=["sync", "async"])
def test_a_step_with_every_trajectory_failed_is_skipped_and_training_goes_on(tmp_path, async_k):
    server = HttpTextcraft()
    server.start()
    config = write_config(tmp_path / "env.json", [server])
    run = TrainRun(SMOKE, tmp_path / "run", smoke_sets(config, steps=4, max_outage_s=300, async_k=async_k))
    try:
        run.wait_until(lambda: len(run.rows()) >= 1, "the first step")
        server.kill()  # down for as long as it takes a step to find it so
        run.wait_for_log(SKIPPED, "a skipped step")
        server.start()
        code = run.finish()
    finally:
        run.stop()
        server.kill()
    log = run.log()
    assert code == 0, log[-4000:]
    assert TRACEBACK not in log
    rows = run.rows()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # skipped steps take no step number: the version stays
    skipped = sum(r["rollout/skipped_steps"] for r in rows)
    assert skipped >= 1 and rows[-1]["rollout/skipped_steps_total"] == skipped
    assert summary_of(run.out)["skipped_steps"] == skipped and summary_of(run.out)["steps"] == 4
    assert any(r["rollout/skipped_steps"] and r["rollout/infra_failed"] < r["rollout/trajectories"]
               for r in rows)  # the step after the outage trained on trajectories that ran


def test_an_environment_that_stays_down_stops_the_run_with_a_checkpoint_that_resumes(tmp_path):
    server = HttpTextcraft()
    server.start()
    config = write_config(tmp_path / "env.json", [server])
    sets = smoke_sets(config, steps=3, max_outage_s=2)
    run = TrainRun(SMOKE, tmp_path / "run", sets)
    try:
        run.wait_until(lambda: len(run.rows()) >= 1, "the first step")
        server.kill()
        code = run.finish()
    finally:
        run.stop()
    log = run.log()
    assert code != 0 and TRACEBACK not in log, log[-4000:]
    assert "error: environment outage" in log and "server 'textcraft'" in log and "--resume" in log, log[-3000:]
    summary = summary_of(run.out)
    assert summary["stopped_by"] == "env_outage" and summary["skipped_steps"] >= 1
    trained = summary["steps"]
    assert (run.out / "checkpoints" / f"step_{trained:06d}").is_dir()
    assert f"checkpoints/step_{trained:06d}" in log  # the message names it
    server.start()
    try:
        resumed = TrainRun(SMOKE, run.out, sets, resume=True)
        code = resumed.finish()
    finally:
        server.kill()
    assert code == 0, resumed.log()[-4000:]
    summary = summary_of(run.out)
    assert summary["resumed_from_step"] == trained and summary["steps"] == 3
    assert [r["step"] for r in resumed.rows()] == [1, 2, 3]


def test_a_server_down_under_some_trajectories_of_a_step_leaves_the_rest_to_train(tmp_path):
    """Two environment servers, one task on each, both tasks in every step: with one server down, every step trains
    on the other's trajectories and none is skipped."""
    import json

    up, down = HttpTextcraft(name="textcraft"), HttpTextcraft(name="craft_b")
    up.start()
    down.start()
    config = write_config(tmp_path / "env.json", [up, down])
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": "Craft the goal.", "answer": None,
                                         "env": {"server": name, "task_id": i}}) + "\n"
                             for i, name in enumerate(["textcraft", "craft_b"])))
    run = TrainRun(SMOKE, tmp_path / "run",
                   [*smoke_sets(config, steps=4, max_outage_s=300, servers=("textcraft", "craft_b")),
                    f"data.train_file={tasks}"])
    try:
        run.wait_until(lambda: len(run.rows()) >= 1, "the first step")
        down.kill()
        code = run.finish()
    finally:
        run.stop()
        up.kill()
        down.kill()
    assert code == 0, run.log()[-4000:]
    rows = run.rows()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["rollout/skipped_steps"] for r in rows) == 0
    partial = [r for r in rows if 0 < r["rollout/infra_failed"] < r["rollout/trajectories"]]
    assert partial, rows  # steps 3 and 4 at least ran with craft_b down
    for r in partial:
        assert r["rollout/trained_tokens"] > 0 and r["rollout/trained_on_infra_failures"] == 0


# --------------------------------------------------------------------------------------------- the rule itself
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _traj(failed: bool, server: str = "textcraft"):
    from rlfactory.rollout.trajectory import Trajectory

    return Trajectory(id="t/0", prompt_ids=[] if failed else [1, 2], task={"env": {"server": server}},
                      finish_reason="error" if failed else "stop",
                      error=f"RuntimeError: could not open the task's episode with reset(...): Error: tool server "
                            f"'{server}' is down (ConnectError)" if failed else None)


def test_the_guard_skips_empty_steps_counts_them_and_stops_past_the_bound():
    from rlfactory.trainer.outage import EnvOutageError, OutageGuard, Verdict

    clock = Clock()
    guard = OutageGuard(60, clock=clock)
    assert guard.judge([_traj(True), _traj(False)], 1) is Verdict.TRAIN  # partly failed: trains on the rest
    assert guard.judge([_traj(True), _traj(True, "web")], 2) is Verdict.SKIP
    clock.now = 59
    assert guard.judge([_traj(True)], 2) is Verdict.SKIP
    assert guard.row_metrics() == {"rollout/skipped_steps": 2.0, "rollout/skipped_steps_total": 2.0}
    clock.now = 60
    assert guard.judge([_traj(True)], 2) is Verdict.STOP
    err = guard.error(1, "RUN/checkpoints/step_000001")
    assert isinstance(err, EnvOutageError)
    assert "server 'textcraft': 3 trajectories" in str(err) and "server 'web': 1" in str(err)
    assert "max_env_outage_s (60 s)" in str(err) and "step_000001" in str(err) and "--resume" in str(err)
    assert guard.judge([_traj(False)], 2) is Verdict.TRAIN  # back: the next outage starts its own clock
    assert guard.row_metrics()["rollout/skipped_steps_total"] == 3
    assert OutageGuard(0, clock=clock).judge([_traj(True)], 1) is Verdict.STOP  # 0: stop at the first


def test_prompt_groups_of_rows_without_a_prompt():
    from rlfactory.algorithms.grpo import build_batch, prompt_groups

    t = _traj(True).model_copy(update={"response_ids": [5], "loss_mask": [0], "logprobs": [0.0]})
    first, inverse = prompt_groups(build_batch([t, t.model_copy()], pad_id=0))  # [N, 0] prompts
    assert first.tolist() == [0] and inverse.tolist() == [0, 0]
