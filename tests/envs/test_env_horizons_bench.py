"""bench/horizons.py's collapse flag: the training reward's 5-step means over full windows only. A first batch that
happened to score well (one step, not a trend) must not count as the best the run reached. And bench/env_learning.py's
behaviour figures, read from an eval's transcripts."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_module(file: str, name: str):
    """bench/<file> loaded as a module (bench scripts import env_learning beside them, which stays imported)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def horizons():
    return _bench_module("horizons.py", "horizons_bench")


def test_a_lucky_first_step_is_not_the_best(horizons):
    # TextCraft, fixed 8 turns, seed 1 (2026-12-03): step 1 scored 0.547, then the run rose slowly to ~0.34
    rewards = [0.547, 0.266, 0.297, 0.219, 0.141, 0.188, 0.438, 0.234, 0.3, 0.35, 0.33, 0.36]
    means = horizons.five_step_means(rewards)
    assert len(means) == len(rewards) - 4
    assert means[0] == pytest.approx(sum(rewards[:5]) / 5)
    assert max(means) - means[-1] < 0.2  # no collapse: the best full window is recent


def test_a_real_fall_is_seen(horizons):
    rewards = [0.1] * 5 + [0.6] * 10 + [0.2] * 5
    means = horizons.five_step_means(rewards)
    assert max(means) == pytest.approx(0.6) and means[-1] == pytest.approx(0.2)


def test_short_runs_have_one_mean(horizons):
    assert horizons.five_step_means([0.2, 0.4]) == [pytest.approx(0.3)]
    assert horizons.five_step_means([]) == [0.0]


def _eval_rows(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _episode(first_message: str, actions: list[str]) -> dict:
    return {"tool_calls": [{"name": "step", "arguments": {"action": a}} for a in actions],
            "messages": [{"role": "system", "content": "You craft items."}, {"role": "user", "content": first_message}]
            + [{"role": "assistant", "content": ""} for _ in actions]}


def test_textcraft_first_action_style_is_a_get_of_the_goal_itself(horizons, tmp_path):
    """bench/env_learning.py's TextCraft behaviour figure: a first action that asks for the goal (`get N <goal>`),
    read from the reset observation's goal line; a get of an ingredient, of a longer name or a craft is not."""
    import env_learning

    obs = "Crafting commands:\ncraft 6 stone slab using 3 stone\n\nGoal: craft {}."
    rows = [_episode(obs.format("stone slab"), ["get 1 stone slab", "get 3 stone"]),   # asks
            _episode(obs.format("stone slab"), ["get 3 stone", "craft 6 stone slab using 3 stone"]),
            _episode(obs.format("slab"), ["get 1 stone slab"]),                       # another item's name
            _episode(obs.format("stone slab"), ["craft 1 stone slab using 3 stone"])]
    got = env_learning.behaviour(_eval_rows(tmp_path, rows), "textcraft")
    assert got == {"turns_mean": 1.5, "first_action_asks_goal_share": 0.25}
    babyai = env_learning.behaviour(tmp_path, "babyai")
    assert babyai["first_action_macro_share"] == 0.0  # none of these starts with an AgentGym macro


def test_web_first_action_style_is_a_search_for_the_named_product(horizons, tmp_path):
    """bench/env_learning.py's web behaviour figure: a first action that types the product the task names, exactly
    as the intent spells it (any of the six shop questions' shapes); part of the name, a click or a stop is not."""
    import env_learning

    page = "Task: {}\n\nTab 0 (current): Home - Shop\n[10] searchbox 'Search'"
    rows = [_episode(page.format("What is the price of the Maple Active Glass Blanket?"),
                     ["type [10] [Maple Active Glass Blanket] [1]", "click [91]"]),
            _episode(page.format("How many reviews does the Solace Classic Recycled Mug have?"),
                     ["type [10] [Solace Classic Recycled Mug] [1]"]),
            _episode(page.format("In which colours is the Solace Classic Recycled Mug available?"),
                     ["type [10] [Solace Classic] [1]"]),                                 # part of the name
            _episode(page.format("In which category is the Nordic Bold Canvas Shirt listed?"), ["stop [Shirts]"])]
    got = env_learning.behaviour(_eval_rows(tmp_path, rows), "web")
    assert got == {"turns_mean": 1.25, "first_action_searches_product_share": 0.5}


def test_every_credit_bench_method_is_a_valid_recipe_and_returns_weights_the_progress_entry():
    """bench/credit.py's methods are recipe overrides: each must load on the learning recipe it edits, and the
    `returns` method's process reward must weight the recipe's `env_progress` entry, not another function."""
    from rlfactory.recipe.schema import Recipe

    credit = _bench_module("credit.py", "credit_bench")
    for env in ("babyai", "textcraft"):
        table = credit.methods(env)
        assert set(table) == {"grpo", *credit.METHODS}
        for name, sets in table.items():
            recipe = Recipe.from_yaml(credit.RECIPES[env], sets)
            weights = {f.function: f.weight for f in recipe.rewards.functions}
            assert weights["env_success"] == 1.0, (env, name)
            if name == "returns":
                assert recipe.algorithm.turn_credit.estimator == "returns"
                assert weights["env_progress"] == 0.2, env
            assert recipe.data.skip_settled_epochs == (credit.SKIP_EPOCHS if name == "skip" else 0), (env, name)


def test_an_evals_solved_tasks_are_read_from_success_not_from_a_weighted_reward(horizons, tmp_path):
    """bench/credit.py's gained / lost tasks come from `env_learning.solved`: a task is solved when its
    `env_success` is 1 (a process reward in the weighted total does not count), or, without components, when its
    reward is 1."""
    import env_learning

    rows = [{"task_id": "t1", "reward": 1.0, "reward_components": {"env_success": 1.0}},
            {"task_id": "t2", "reward": 1.2, "reward_components": {"env_success": 0.0, "env_progress": 1.0}},
            {"task_id": "t3", "reward": 1.0},
            {"task_id": "t0", "reward": 0.0}]
    assert env_learning.solved(_eval_rows(tmp_path, rows)) == ["t1", "t3"]


def test_reach_is_read_from_an_eval_with_k_samples_a_task(horizons, tmp_path):
    """`--reach K`'s figures: pass@K and a sample's mean success as `rlfactory eval --k K` wrote them, and each task
    some sample solved, once (two of t1's samples solved it; none of t2's)."""
    import env_learning

    rows = [{"task_id": "t1", "reward": 1.0, "reward_components": {"env_success": 1.0}},
            {"task_id": "t1", "reward": 1.0, "reward_components": {"env_success": 1.0}},
            {"task_id": "t2", "reward": 0.0, "reward_components": {"env_success": 0.0}},
            {"task_id": "t2", "reward": 0.0, "reward_components": {"env_success": 0.0}}]
    out = _eval_rows(tmp_path, rows)
    (out / "eval" / "eval.json").write_text(json.dumps({"pass@1": 0.5, "pass@2": 0.5, "k": 2, "tasks": 2}))
    assert env_learning.read_reach(out) == {"k": 2, "pass@2": 0.5, "sample_success": 0.5, "reached": ["t1"]}


def test_babyai_reach_finds_the_hidden_target_the_demonstrator_walks_past():
    """bench/babyai_reach.py on AgentGym task 10016 (the purple ball behind a door): the search's shortest solution is
    turn, go through the door, pick it up (3 actions, checked by replaying it on a fresh episode); the demonstrator,
    which walks when no macro names the target, does not finish within 6; a task whose target is in reach, does."""
    from rlfactory.envs.babyai import BabyAIEnv
    from rlfactory.envs.solvers import babyai_shortest

    reach = _bench_module("babyai_reach.py", "babyai_reach_bench")
    found = babyai_shortest(10016, 3, max_states=None)
    assert found["solution"] is not None and len(found["solution"]) == 3 and found["stopped"] is None
    env = BabyAIEnv(task_set="agentgym")
    env.reset(10016)
    results = [env.step(word) for word in found["solution"]]
    assert results[-1].done and results[-1].score > 0
    assert babyai_shortest(10016, 2, max_states=None)["solution"] is None
    assert babyai_shortest(10016, 3, max_states=5)["stopped"] == "states"  # a bound stops it, and says which
    assert not reach.demonstrator_solves(10016, 6) and reach.demonstrator_solves(10000, 6)
