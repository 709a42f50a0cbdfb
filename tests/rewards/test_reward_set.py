"""RewardSet: loading by name / dotted path / file, up-front validation, weighted async scoring, step rewards,
error accounting."""
from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from rlfactory.errors import ConfigError
from rlfactory.recipe.rewards import RewardsConfig, RewardSpec
from rlfactory.reward import RewardSet, token_level_rewards

USER_REWARDS = '''
import asyncio
import sys
import threading
from pathlib import Path

SEEN_THREADS = set()
IN_FLIGHT = {"now": 0, "max": 0}


def brevity(completion, max_chars=20):
    SEEN_THREADS.add(threading.get_ident())
    return 1.0 if len(completion) <= max_chars else 0.0


async def slow_async(trajectory, delay_s=0.01):
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
    await asyncio.sleep(delay_s)
    IN_FLIGHT["now"] -= 1
    return 0.5


def components(answer, final_response):
    return {"score": float(str(answer) in final_response), "length": float(len(final_response))}


def metrics_only(final_response):
    return {"chars": float(len(final_response))}


def explodes_on_odd(trajectory):
    if int(trajectory.id[1:]) % 2:
        raise RuntimeError("boom for " + trajectory.id)
    return 1.0


def per_turn(trajectory, value=1.0):
    return [value * (i + 1) for i in range(trajectory.num_turns)]


def wrong_length(trajectory):
    return [1.0]


def returns_none(completion):
    return None


def catch_all(**kwargs):
    return float(sorted(kwargs) == ["answer", "cache", "completion", "final_response", "messages", "metadata",
                                    "task", "tool_calls", "trajectory"])


def needs_unknown(completion, respone):
    return 0.0


def positional_only(completion, /):
    return 0.0


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def recipe_dir(tmp_path):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_REWARDS))
    return tmp_path


def _set(recipe_dir, *specs, **cfg) -> RewardSet:
    return RewardSet.from_config(RewardsConfig(functions=[RewardSpec(**s) for s in specs], **cfg), recipe_dir)


async def test_registered_names_dotted_paths_and_files(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "exact_match"}, {"function": "rlfactory.rewards.qa:f1", "weight": 0.5},
              {"function": "rlfactory.rewards.qa.contains", "weight": 0, "name": "has_answer"},
              {"function": "my_rewards.py:brevity", "weight": 2.0, "kwargs": {"max_chars": 100}})
    assert [f.name for f in rs.functions] == ["exact_match", "f1", "has_answer", "brevity"]
    trajs = [make_traj(["<answer>42</answer>"], answer="42", tid="t0"),
             make_traj(["<answer>41</answer>"], answer="42", tid="t1")]
    metrics = await rs.score(trajs)
    assert trajs[0].reward == pytest.approx(1.0 + 0.5 * 1.0 + 2.0)
    assert trajs[1].reward == pytest.approx(0.0 + 0.0 + 2.0)
    assert trajs[0].reward_components == {"exact_match": 1.0, "f1": 1.0, "has_answer": 1.0, "brevity": 1.0}
    assert metrics["reward/mean"] == pytest.approx(2.75)
    assert metrics["reward/std"] == pytest.approx(0.75)
    assert metrics["reward/exact_match"] == 0.5 and metrics["reward/has_answer"] == 0.5
    assert metrics["reward/errors"] == 0.0
    assert not any(t.reward_failed for t in trajs)


def test_every_problem_is_reported_at_once_naming_the_field(recipe_dir):
    specs = [
        {"function": "exct_match"},
        {"function": "missing.py:fn"},
        {"function": "my_rewards.py:nope"},
        {"function": "my_rewards.py:NOT_A_FUNCTION"},
        {"function": "my_rewards.py:needs_unknown"},
        {"function": "my_rewards.py:brevity", "kwargs": {"max_char": 3}},
        {"function": "my_rewards.py:brevity", "weight": float("nan"), "name": "b2"},
        {"function": "f1"}, {"function": "f1"},
        {"function": "no_such_pkg_xyz.mod:fn"},
        {"function": "my_rewards.py:positional_only"},
        {"function": "exact_match", "name": "em2", "kwargs": {"answer": "x"}},
    ]
    with pytest.raises(ConfigError) as info:
        _set(recipe_dir, *specs)
    problems = info.value.problems
    text = str(info.value)
    assert "rewards.functions[0].function: no reward function 'exct_match' (did you mean 'exact_match'?)" in text
    assert any(p.startswith("rewards.functions[1].function: file 'missing.py' not found") for p in problems)
    assert any(p.startswith("rewards.functions[2].function:") and "nope" in p for p in problems)
    assert any(p.startswith("rewards.functions[3].function:") and "not a function" in p for p in problems)
    assert any(p.startswith("rewards.functions[4].function: parameter 'respone' of needs_unknown is not one")
               for p in problems)
    assert any(p.startswith("rewards.functions[5].kwargs.max_char:") and "did you mean 'max_chars'" in p
               for p in problems)
    assert any(p.startswith("rewards.functions[6].weight:") for p in problems)
    assert any(p.startswith("rewards.functions[8].name: 'f1' is already used by rewards.functions[7]")
               for p in problems)
    assert any(p.startswith("rewards.functions[9].function: ModuleNotFoundError") for p in problems)
    assert any(p.startswith("rewards.functions[10].function:") and "positional-only" in p for p in problems)
    assert any(p.startswith("rewards.functions[11].kwargs.answer:") for p in problems)
    assert len(problems) == 11


def test_config_error_names_the_recipe_file(recipe_dir):
    with pytest.raises(ConfigError, match=r"^recipe.yaml: rewards.functions\[0\]"):
        RewardSet.from_config(RewardsConfig(functions=[RewardSpec(function="exct")]), recipe_dir, file="recipe.yaml")


def test_the_old_top_level_spelling_names_the_new_one(tmp_path, monkeypatch):
    # The shipped reward modules used to install as a top-level `rewards` package. Outside a checkout (where no
    # `rewards/` folder is importable) the old spelling gets an error that names the new one.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".").resolve() / "rewards").is_dir()])
    monkeypatch.delitem(sys.modules, "rewards", raising=False)
    with pytest.raises(ConfigError) as e:
        RewardSet.from_config(RewardsConfig(functions=[RewardSpec(function="rewards.env:env_score")]), tmp_path)
    msg = e.value.problems[0]
    assert msg.startswith("rewards.functions[0].function: 'rewards.env:env_score'")
    assert "'rlfactory.rewards.env:env_score'" in msg and "the registered name 'env_score'" in msg


async def test_sync_functions_run_off_the_loop_and_async_ones_are_limited(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:brevity"},
              {"function": "my_rewards.py:slow_async", "weight": 0}, max_concurrency=3)
    mod = rs.functions[0].func.__globals__
    trajs = [make_traj(["short"], tid=f"t{i}") for i in range(12)]
    await rs.score(trajs)
    assert threading.get_ident() not in mod["SEEN_THREADS"]  # sync reward ran in a worker thread
    assert 1 < mod["IN_FLIGHT"]["max"] <= 3  # async rewards overlapped, within the limit
    assert all(t.reward == 1.0 and t.reward_components["slow_async"] == 0.5 for t in trajs)


async def test_dict_components_and_metric_only_dicts(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:components", "weight": 2.0},
              {"function": "my_rewards.py:metrics_only", "weight": 0})
    t = make_traj(["<answer>42</answer>"], answer=42)
    metrics = await rs.score([t])
    assert t.reward == 2.0
    assert t.reward_components == {"components": 1.0, "components/length": 19.0, "metrics_only/chars": 19.0}
    assert metrics["reward/components"] == 1.0 and metrics["reward/errors"] == 0.0


async def test_dict_without_score_is_an_error_when_trained_on(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:metrics_only", "weight": 1.0}, failure_value=-1.0)
    t = make_traj(["x"])
    metrics = await rs.score([t])
    assert t.reward == -1.0 and t.reward_failed and metrics["reward/errors"] == 1.0


async def test_raising_function_is_counted_logged_flagged_and_gets_the_failure_value(recipe_dir, make_traj,
                                                                                      caplog):
    rs = _set(recipe_dir, {"function": "my_rewards.py:explodes_on_odd"}, {"function": "exact_match", "weight": 0},
              failure_value=-0.5)
    trajs = [make_traj(["<answer>1</answer>"], answer="1", tid=f"t{i}") for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="rlfactory.reward"):
        metrics = await rs.score(trajs)
    assert [t.reward for t in trajs] == [1.0, -0.5, 1.0, -0.5]
    assert [t.reward_failed for t in trajs] == [False, True, False, True]
    assert metrics["reward/errors"] == 2.0 and metrics["reward/errors/explodes_on_odd"] == 2.0
    assert metrics["reward/explodes_on_odd"] == 1.0  # the mean over the samples it did score
    assert trajs[1].reward_components == {"exact_match": 1.0}  # the other functions' components are kept
    assert "explodes_on_odd failed on trajectory t1: RuntimeError: boom for t1" in caplog.text
    assert "trajectory t3" in caplog.text


async def test_bad_return_values_are_errors(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:returns_none"}, {"function": "my_rewards.py:wrong_length"})
    t = make_traj(["a", "b"])
    metrics = await rs.score([t])
    assert metrics["reward/errors"] == 2.0 and t.reward_failed and t.reward == 0.0 and t.step_rewards is None


async def test_catch_all_kwargs_receives_every_injectable(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:catch_all"})
    t = make_traj(["x"])
    await rs.score([t])
    assert t.reward == 1.0


async def test_step_rewards_land_on_the_last_token_of_each_turn(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:per_turn", "weight": 0.5},
              {"function": "exact_match", "weight": 1.0}, {"function": "my_rewards.py:per_turn", "name": "logged",
                                                            "weight": 0, "kwargs": {"value": 10.0}})
    # three assistant turns of 3 tokens, two tool turns of 2 tokens: assistant spans [0,3) [5,8) [10,13)
    t = make_traj(["call", "call", "<answer>7</answer>"], answer="7")
    await rs.score([t])
    assert t.step_rewards == [0.5, 1.0, 1.5]  # weighted; the weight-0 copy is logged, not placed
    assert t.reward_components["per_turn"] == 6.0 and t.reward_components["logged"] == 60.0
    assert t.reward == pytest.approx(0.5 * 6.0 + 1.0)
    tokens = token_level_rewards(t)
    assert len(tokens) == len(t.response_ids) == 13
    assert tokens[2] == 0.5 and tokens[7] == 1.0
    assert tokens[12] == pytest.approx(1.5 + 1.0)  # last step + the outcome reward on the final policy token
    assert sum(tokens) == pytest.approx(t.reward)
    assert all(v == 0.0 for i, v in enumerate(tokens) if i not in (2, 7, 12))


def test_token_level_rewards_without_steps_put_the_reward_on_the_last_policy_token(make_traj):
    t = make_traj(["a", "b"])
    t.loss_mask[-1] = 0  # e.g. a trailing template token the policy did not produce
    t.reward = 0.75
    tokens = token_level_rewards(t)
    assert tokens[6] == 0.75 and sum(tokens) == 0.75
    t.reward = None
    assert token_level_rewards(t) == [0.0] * 8


async def test_scoring_does_not_block_other_coroutines(recipe_dir, make_traj):
    rs = _set(recipe_dir, {"function": "my_rewards.py:slow_async", "kwargs": {"delay_s": 0.05}})
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    await rs.score([make_traj(["x"], tid=f"t{i}") for i in range(4)])
    task.cancel()
    assert ticks > 1


def test_every_registered_name_loads_and_takes_only_suppliable_parameters(tmp_path):
    from rlfactory.reward import REGISTRY

    # llm_judge needs its endpoint in kwargs; everything else loads with no kwargs at all
    specs = [RewardSpec(function=n, kwargs={"base_url": "http://127.0.0.1:9/v1", "model": "m"}
                        if n == "llm_judge" else {}) for n in REGISTRY]
    rs = RewardSet.from_config(RewardsConfig(functions=specs), tmp_path)
    assert [f.name for f in rs.functions] == list(REGISTRY)
    assert next(f for f in rs.functions if f.name == "llm_judge").is_async
    # the shipped synchronous functions are a few string operations: called on the loop, not in a worker thread
    assert [f.name for f in rs.functions if not f.inline] == ["llm_judge"]


async def test_registered_sync_functions_run_on_the_loop_and_score_as_before(recipe_dir, make_traj, monkeypatch):
    rs = _set(recipe_dir, {"function": "tool_calls_well_formed"}, {"function": "my_rewards.py:brevity"})
    assert [f.inline for f in rs.functions] == [True, False]
    seen = []
    real = rs.functions[0].func
    monkeypatch.setattr(rs.functions[0], "func", lambda **kw: seen.append(threading.get_ident()) or real(**kw))
    trajs = [make_traj(["short"], tid=f"t{i}") for i in range(3)]
    await rs.score(trajs)
    assert seen == [threading.get_ident()] * 3
    assert all(t.reward_components["tool_calls_well_formed"] == real(completion=t.completion) for t in trajs)


def test_a_judge_without_its_endpoint_is_rejected_up_front(tmp_path):
    with pytest.raises(ConfigError) as info:
        RewardSet.from_config(RewardsConfig(functions=[RewardSpec(function="llm_judge")]), tmp_path)
    assert [p.split(" of ")[0] for p in info.value.problems] == [
        "rewards.functions[0].function: parameter 'base_url'", "rewards.functions[0].function: parameter 'model'"]
