"""Turn-level credit and branched groups in real runs: TextCraft's server reports each episode's state with every
step (equal states equal), a branched group's branches go on in forks of their root's episode, and `rlfactory train`
with `algorithm.turn_credit` or `rollout.branching` takes GRPO steps in the synchronous and the asynchronous loop on
the TextCraft warm start (models/textcraft-crafter) against the real server."""
from __future__ import annotations

import json

import pytest
from cli_runs import REPO, SPREAD_REWARD, rlf, sets

from rlfactory.algorithms.turn_credit import turn_states
from rlfactory.rollout.trajectory import Trajectory

RECIPE = REPO / "recipes" / "textcraft_learn.yaml"
SMALL = ["trainer.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.horizon={type: fixed, turns: 4}",
         "algorithm.micro_batch_size=8", "trainer.save_every_steps=0", "trainer.log.tensorboard=false"]
# The warm start often fails every sample of a group alike at 4 turns, which leaves nothing to train: the runs here
# add SPREAD_REWARD, so every step has turns to credit.


def test_textcraft_reports_its_state_with_every_step_and_turns_take_it(tmp_path):
    out = tmp_path / "trajs.jsonl"
    proc = rlf("rollout", str(RECIPE), "--limit", "2", "--out", str(out), *sets(SMALL))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajs = [Trajectory.model_validate_json(ln) for ln in out.read_text().splitlines() if ln.strip()]
    steps = [c for t in trajs for c in t.tool_calls if c.name.endswith("step") and not c.is_error]
    assert steps and all(isinstance(c.structured.get("state"), str) for c in steps)
    multi = [t for t in trajs if t.num_turns > 1]
    assert multi, "the warm start plays several turns"
    for t in multi:
        states = turn_states(t)
        assert states[0] == "start"
        for k, s in enumerate(states[1:], 1):  # a turn after a failed call keeps the state before it
            assert s.startswith("env:") or s == states[k - 1]
    # the same inventory is the same state: a step that changed nothing repeats the state before it
    by_state: dict[str, set[str]] = {}
    for c in steps:
        by_state.setdefault(c.structured["state"], set()).add(str(c.structured.get("task_id")))
    assert all(len(tasks) == 1 for tasks in by_state.values())  # no state is shared across tasks


@pytest.mark.parametrize("estimator,k", [("anchors", 0), ("returns", 1)])
def test_textcraft_trains_with_turn_credit_in_both_loops(tmp_path, estimator, k):
    reward_file = tmp_path / "spread.py"
    reward_file.write_text(SPREAD_REWARD)
    out = tmp_path / "run"
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), *sets(SMALL + [
        "trainer.total_steps=2", f"trainer.max_staleness_steps={k}", f"algorithm.turn_credit.estimator={estimator}",
        f"rewards.functions.1={{function: '{reward_file}:id_spread', weight: 1.0}}"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert len(rows) == 2
    for row in rows:
        assert 0 < row["credit/turns_with_company"] <= 1  # every group shares at least its first turn
        assert row["rollout/rows_with_signal"] > 0 and row["loss/grad_norm"] > 0
    if k:
        assert max(r["async/staleness_token_max"] for r in rows) <= 1


BRANCHED = ["rollout.branching.width=2", "rollout.branching.at_turn=1"]


def test_branches_go_on_in_forks_of_their_roots_episode(tmp_path):
    out = tmp_path / "trajs.jsonl"
    proc = rlf("rollout", str(RECIPE), "--limit", "4", "--out", str(out), *sets(SMALL + BRANCHED))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajs = [Trajectory.model_validate_json(ln) for ln in out.read_text().splitlines() if ln.strip()]
    assert len(trajs) == 16 and all(t.branch is not None for t in trajs)
    by_root: dict[tuple[str, int], list[Trajectory]] = {}
    for t in trajs:
        by_root.setdefault((t.group_id, t.branch.root), []).append(t)
    went_on = 0
    for branches in by_root.values():
        assert [t.branch.child for t in branches] == [0, 1]
        first, second = branches
        n = first.branch.prefix_tokens
        assert n == second.branch.prefix_tokens and first.prompt_ids == second.prompt_ids
        assert first.response_ids[:n] == second.response_ids[:n]  # the root's turn, generated once
        own = [c for c in second.tool_calls if c.turn >= second.branch.prefix_turns and c.structured
               and "steps" in c.structured]
        root_calls = [c for c in first.tool_calls if c.turn < first.branch.prefix_turns and c.structured
                      and "steps" in c.structured]
        if own and root_calls:
            went_on += 1
            # its first call after the branch ran in a fork of the root's episode, an episode of its own that
            # carried the root's step count over
            assert own[0].structured["steps"] == len(root_calls) + 1
            assert own[0].structured["episode_id"] != root_calls[0].structured["episode_id"]
    assert went_on >= 1


@pytest.mark.parametrize("k", [0, 1])
def test_textcraft_trains_branched_groups_in_both_loops(tmp_path, k):
    reward_file = tmp_path / "spread.py"
    reward_file.write_text(SPREAD_REWARD)
    out = tmp_path / "run"
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), *sets(SMALL + BRANCHED + [
        "trainer.total_steps=2", f"trainer.max_staleness_steps={k}",
        f"rewards.functions.1={{function: '{reward_file}:id_spread', weight: 1.0}}"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/trajectories"] == 8 and row["rollout/branches"] == 4
        assert row["rollout/branch_shared_tokens"] > 0
        assert row["rollout/rows_with_signal"] > 0 and row["loss/grad_norm"] > 0


def test_uncertain_roots_branch_early_and_sure_ones_at_at_turn(tmp_path):
    def prefix_turns(uncertainty: float) -> set[int]:
        out = tmp_path / f"u{uncertainty}.jsonl"
        proc = rlf("rollout", str(RECIPE), "--limit", "2", "--out", str(out), *sets(SMALL + [
            "rollout.branching.width=2", "rollout.branching.at_turn=3", "rollout.branching.when=uncertain",
            f"rollout.branching.uncertainty={uncertainty}"]))
        assert proc.returncode == 0, proc.stderr[-3000:]
        trajs = [Trajectory.model_validate_json(ln) for ln in out.read_text().splitlines() if ln.strip()]
        # roots that were still playing when they branched (a root that ended first shares all it played)
        return {t.branch.prefix_turns for t in trajs if t.num_turns > t.branch.prefix_turns}

    early, late = prefix_turns(0.0), prefix_turns(1e9)
    assert early <= {1}  # every turn surprises a policy at least 0 nats: branch after the first
    assert late <= {3}  # none surprises it that much: branch at at_turn
    assert early | late  # and some roots did play on past their branch point


def test_rollout_refuses_a_sample_count_the_branches_do_not_divide(tmp_path):
    proc = rlf("rollout", str(RECIPE), "--out", str(tmp_path / "t.jsonl"), "--samples", "3",
               *sets(["rollout.branching.width=2"]))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "rollout.branching.width (2) must divide --samples 3" in proc.stdout + proc.stderr
    assert not (tmp_path / "t.jsonl").exists()
