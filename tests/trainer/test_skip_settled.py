"""`data.skip_settled_epochs`: a training task whose group scored alike sits out the next epochs of draws. The
sampler's rule on its own (whole epochs, every task set aside, its state across a resume), which groups count as
settled, the recipes that refuse it, and a real run of the tiny setup: the settled tasks miss the next epoch, the
others come back every epoch, and a killed-and-resumed run draws what the unbroken one drew."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import yaml
from cli_runs import rlf, sets
from run_metrics import assert_same_metrics, rows_of

from rlfactory.data.tasks import TaskSampler
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, groups_of
from rlfactory.trainer.settled import scored_alike, settled_draws


def _epochs(sampler: TaskSampler, n_epochs: int) -> list[list[int]]:
    """Draw one at a time; the draws grouped by the epoch the sampler was in when it made them."""
    out: list[list[int]] = []
    while sampler.epoch < n_epochs:
        (i,) = sampler.next(1)
        while len(out) <= sampler.epoch:
            out.append([])
        out[sampler.epoch].append(i)
    return out


def test_a_task_set_aside_misses_the_next_whole_epochs_then_comes_back():
    s = TaskSampler(6, seed=3)
    first = s.next(6)  # the whole of epoch 0
    assert sorted(first) == list(range(6)) and s.epoch == 0
    s.set_aside([first[0], first[1]], epochs=2)
    assert s.tasks_set_aside() == 2
    rest = _epochs(s, 4)
    assert sorted(rest[1]) == sorted(rest[2]) == sorted(first[2:])  # epochs 1 and 2 pass over them
    assert sorted(rest[3]) == list(range(6))  # epoch 3: back
    assert s.draws_skipped == 4 and s.tasks_set_aside() == 0


def test_when_every_task_is_set_aside_the_draws_go_on():
    s = TaskSampler(4, seed=0)
    s.set_aside(s.next(4), epochs=5)
    assert s.tasks_set_aside() == 4
    got = s.next(3)  # no task is drawable for 5 epochs: the draws go on in the permutation's order, no stall
    assert len(got) == 3 and all(0 <= i < 4 for i in got)


def test_the_sampler_state_carries_what_is_set_aside():
    a = TaskSampler(10, seed=7)
    a.next(7)
    a.set_aside([1, 4, 8], epochs=1)
    a.next(5)
    b = TaskSampler(10, seed=7)
    b.load_state(json.loads(json.dumps(a.state())))  # a checkpoint's state goes through JSON
    assert [a.next(3) for _ in range(8)] == [b.next(3) for _ in range(8)]
    assert (a.draws_skipped, a.tasks_set_aside()) == (b.draws_skipped, b.tasks_set_aside())
    plain = TaskSampler(10, seed=7)
    assert set(plain.state()) == {"epoch", "pos", "seed", "n"}  # nothing set aside: a checkpoint as before


def _traj(group: str, reward: float | None, *, infra: bool = False, reward_failed: bool = False) -> Trajectory:
    calls = [ToolCallRecord(turn=0, name="x", is_error=True, infra=True)] if infra else []
    return Trajectory(id=f"{group}/{reward}", task_id=group, group_id=group, prompt_ids=[1], reward=reward,
                      reward_failed=reward_failed, tool_calls=calls)


def test_settled_groups_are_the_ones_whose_scored_samples_agree():
    trajs = [_traj("a", 1.0), _traj("a", 1.0),                               # all solved: settled
             _traj("b", 0.0), _traj("b", 0.5),                               # a spread: signal
             _traj("c", 0.0), _traj("c", 1.0, infra=True),                   # the infra failure says nothing
             _traj("d", 0.0, reward_failed=True), _traj("d", 0.0, infra=True),  # nothing scored: not settled
             _traj("e", 0.0), _traj("e", 0.0)]                               # all failed: settled
    assert settled_draws([10, 11, 12, 13, 14], trajs) == [10, 12, 14]
    with pytest.raises(ValueError, match="5 tasks were drawn but the batch holds 4 groups"):
        settled_draws([1, 2, 3, 4, 5], trajs[:8])


def test_the_update_counts_a_raised_reward_at_its_failure_value_and_the_task_judgement_does_not():
    # The failure value (0.0) beside a solved sample: a spread the update trains on, but one real outcome only.
    g = [_traj("f", 1.0), _traj("f", 0.0, reward_failed=True)]
    assert scored_alike(g) and not scored_alike(g, as_trained=True)
    g = [_traj("h", 0.0), _traj("h", 0.0, reward_failed=True), _traj("h", 1.0, infra=True)]
    assert scored_alike(g) and scored_alike(g, as_trained=True)  # neither counts the infrastructure failure
    assert not scored_alike([_traj("i", 1.0, infra=True)], as_trained=True)  # nothing left: not alike
    assert list(groups_of(g + [_traj("j", 1.0)])) == ["h", "j"]


@pytest.mark.parametrize("override,where", [("trainer.max_staleness_steps=1", "trainer.max_staleness_steps 1"),
                                            ("engine=verl", "engine verl")])
def test_the_loops_that_draw_ahead_refuse_it(tiny_recipe, override, where):
    proc = rlf("train", str(tiny_recipe), "--dry-run", *sets(["data.skip_settled_epochs=1", override]))
    assert proc.returncode != 0
    assert f"data.skip_settled_epochs is 1 with {where}" in proc.stderr, proc.stderr[-2000:]


HALF_SETTLED = '''
import zlib

def half_settled(trajectory):
    """Every sample of an even task scores 0 (a settled group); an odd task's samples spread."""
    if zlib.crc32(trajectory.task_id.encode()) % 2 == 0:
        return 0.0
    return (sum(trajectory.response_ids) % 101) / 100
'''
STEPS = 9


def _settled(task_id: str) -> bool:
    return zlib.crc32(task_id.encode()) % 2 == 0


@pytest.fixture(scope="module")
def setup(tiny_setup_master, tmp_path_factory) -> tuple[Path, list[str]]:
    """The tiny setup cut to 6 training tasks (3 steps of 2 an epoch), scored by HALF_SETTLED alone."""
    root = tmp_path_factory.mktemp("settled")
    rows = (tiny_setup_master / "train.jsonl").read_text().splitlines()[:6]
    (root / "train.jsonl").write_text("\n".join(rows) + "\n")
    (root / "half.py").write_text(HALF_SETTLED)
    ids = [json.loads(r)["id"] for r in rows]
    assert 0 < sum(map(_settled, ids)) < 6, ids  # the split has both kinds
    recipe = yaml.safe_load((tiny_setup_master / "recipe.yaml").read_text())
    recipe["model"]["path"] = str(tiny_setup_master / recipe["model"]["path"])
    recipe["tools"]["mcp_configs"] = [str(tiny_setup_master / "mcp.json")]
    recipe["data"] = {"train_file": str(root / "train.jsonl"), "skip_settled_epochs": 1}
    recipe["rewards"]["functions"] = [{"function": f"{root / 'half.py'}:half_settled", "weight": 1.0}]
    recipe["trainer"].update(total_steps=STEPS, save_every_steps=1, log={"tensorboard": False,
                                                                         "transcripts_per_step": 8})
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path, ids


def _draws(run: Path) -> list[list[str]]:
    """The tasks each step drew, from its transcripts (every trajectory of the step is saved)."""
    out = []
    for f in sorted((run / "transcripts").glob("step_*.jsonl")):
        seen: list[str] = []
        for ln in f.read_text().splitlines():
            task = json.loads(ln)["task_id"]
            if task not in seen:
                seen.append(task)
        out.append(seen)
    return out


def test_a_run_draws_the_tasks_that_still_teach_and_resumes_the_same(setup, tmp_path):
    recipe, ids = setup
    straight = tmp_path / "straight"
    proc = rlf("train", str(recipe), "--output-dir", str(straight))
    assert proc.returncode == 0, proc.stderr[-3000:]
    draws, rows = _draws(straight), rows_of(straight)
    assert len(draws) == STEPS and all(len(d) == 2 for d in draws)
    epoch0 = [t for d in draws[:3] for t in d]
    assert sorted(epoch0) == sorted(ids)  # the first epoch draws every task
    later = [t for d in draws[3:] for t in d]
    settled = {t for t in ids if _settled(t)}
    # epoch 1 (step 4) draws only the tasks that spread; epoch 2 (steps 5-7) the settled ones again
    assert not settled & set(later[: 6 - len(settled)])
    assert set(later[: 6 - len(settled)]) == set(ids) - settled
    assert settled <= set(later)
    assert rows[2]["data/tasks_set_aside"] == len(settled)
    skipped = [r["data/draws_skipped"] for r in rows]
    assert skipped[:3] == [0, 0, 0] and skipped == sorted(skipped) and skipped[3] > 0
    # killed after step 4 (its checkpoint is the last thing it wrote), resumed: the same draws and metrics
    part = tmp_path / "part"
    proc = rlf("train", str(recipe), "--output-dir", str(part), *sets(["trainer.total_steps=4"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = rlf("train", str(recipe), "--output-dir", str(part), "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _draws(part) == draws
    for a, b in zip(rows_of(part), rows, strict=True):
        assert_same_metrics(a, b)


def test_tasks_set_aside_come_back_when_the_horizon_grows(setup, tmp_path):
    """Set aside for 5 epochs, but the schedule's second stage (from step 5) lets episodes run longer: a task every
    sample failed in one turn may be solved in two, so the settled tasks are drawn again at once."""
    recipe, ids = setup
    run = tmp_path / "run"
    proc = rlf("train", str(recipe), "--output-dir", str(run), *sets([
        "trainer.total_steps=6", "data.skip_settled_epochs=5",
        "rollout.horizon={type: scaling_inter, horizons: [1, 2], interval_steps: 4}"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    draws = _draws(run)
    settled = {t for t in ids if _settled(t)}
    assert not settled & set(draws[3])  # step 4, one turn: only the tasks that spread
    assert settled & {t for d in draws[4:] for t in d}  # steps 5-6, two turns: the settled ones are back
    assert rows_of(run)[4]["data/tasks_set_aside"] < len(settled)
