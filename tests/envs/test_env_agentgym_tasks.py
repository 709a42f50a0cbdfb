"""The `agentgym` task sets: task ids mean what AgentGym's servers mean by them (BabyAI's 40 levels and seeds, its
goal wording and action words; TextCraft's goal order), checked against the conventions themselves (minigrid's own
levels for the goals), over MCP and behind the AgentGym HTTP protocol."""
from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import pytest
from test_env_bridge import start_http_server

from rlfactory.envs.babyai import BabyAIEnv
from rlfactory.envs.babyai_agentgym import AGENTGYM_LEVELS, NOT_RECOGNIZED, RENAMED
from rlfactory.envs.client import EnvClient
from rlfactory.envs.solvers import textcraft_plan
from rlfactory.envs.tasks import server_goals, task_rows
from rlfactory.envs.textcraft import TextCraftEnv
from rlfactory.envs.types import EnvError

SAMPLE_IDS = (0, 1, 3, 16, 39, 40, 41, 123, 399)


def minigrid_goal(level: str, seed: int) -> str:
    """The goal AgentGym's server states for (level, seed): minigrid's mission, "then"/"after you" read as "and"."""
    import gymnasium as gym
    import minigrid  # noqa: F401 - registers the levels

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        env = gym.make(RENAMED.get(level, level))
        env.reset(seed=seed)
    mission = str(env.unwrapped.mission)
    env.close()
    return mission.replace("then", "and").replace("after you", "and")


def test_agentgym_level_table_follows_the_server():
    # AgentGym's all_levels is 1-based: idx % 40 + 1 -> its table; here AGENTGYM_LEVELS[idx % 40].
    assert len(AGENTGYM_LEVELS) == 40 and len(set(AGENTGYM_LEVELS)) == 40
    assert AGENTGYM_LEVELS[0] == "BabyAI-GoToRedBallGrey-v0"  # all_levels[1]
    assert AGENTGYM_LEVELS[16] == "BabyAI-Pickup-v0"  # all_levels[17]
    assert AGENTGYM_LEVELS[39] == "BabyAI-BossLevelNoUnlock-v0"  # all_levels[40]


def test_babyai_agentgym_reset_names_the_level_goal_and_actions():
    env = BabyAIEnv(task_set="agentgym")
    for task_id in SAMPLE_IDS:
        level, seed = AGENTGYM_LEVELS[task_id % 40], task_id // 40
        obs = env.reset(task_id).observation
        assert obs.startswith(f"Level: {RENAMED.get(level, level)}\n"), (task_id, obs[:80])
        assert f"\nYour goal: {minigrid_goal(level, seed)}\n" in obs, (task_id, obs[:200])
        actions = obs.rsplit("Available actions: ", 1)[1]
        listed = json.loads(actions)
        assert {"turn left", "turn right", "check available actions"} <= set(listed)
        assert "go forward" not in listed and all(" forward" not in a or a == "move forward" for a in listed)
        assert "go forward" not in obs  # not even in the words for the view
        assert env.step("go forward").observation.startswith(NOT_RECOGNIZED)
    env.close()


def test_babyai_agentgym_macros_reach_the_goal():
    env = BabyAIEnv(task_set="agentgym")
    # GoToRedBall seed 0; GoToObjS6 seed 0; OpenRedDoor seed 0 (the door opens on the macro's toggle)
    for task_id, action in ((1, "go to red ball 1"), (3, None), (12, "toggle and go through red closed door 1")):
        first = env.reset(task_id)
        if action is None:  # "go to the <colour> <type>": the first such object in view
            target = first.info["mission"].removeprefix("go to the ").removeprefix("go to a ")
            action = f"go to {target} 1"
        assert f'"{action}"' in first.observation, first.observation
        result = env.step(action)
        assert result.done and result.reward > 0 and result.score == result.reward, (task_id, result)
        assert result.observation.startswith("The task is completed.")
    checked = env.reset(0)
    listing = env.step("check available actions")
    assert listing.observation.startswith("You can take the following actions: turn left, turn right")
    assert not listing.done and env.observe() == checked.observation.split("\n", 1)[1]
    env.close()


def test_textcraft_agentgym_goal_order():
    ours, agentgym = TextCraftEnv(), TextCraftEnv(task_set="agentgym")
    depth = agentgym.book.depth
    goals = [agentgym.reset(i).info["goal"] for i in range(agentgym.num_tasks)]
    assert len(goals) == len(agentgym.book.by_output) > ours.num_tasks  # every craftable item is a goal
    assert [depth[g] for g in goals] == sorted(depth[g] for g in goals) and depth[goals[0]] == 1
    assert agentgym.reset(agentgym.num_tasks + 5).info["goal"] == goals[5]  # idx % len(goals)
    obs = agentgym.reset(17).observation
    assert obs.endswith(f"\n\nGoal: craft {goals[17]}.")
    for action in textcraft_plan(obs):
        result = agentgym.step(action)
    assert result.done and result.reward == 1.0


def test_textcraft_shuffled_names_keep_the_world_and_change_every_name():
    """`shuffle_names`: each episode renames the items by a bijection drawn from its task id; the crafting tree is
    the same shape (the planner's plan has the same length and solves it), and one id is always the same world."""
    plain, shuffled = TextCraftEnv(task_set="agentgym"), TextCraftEnv(task_set="agentgym", shuffle_names=True)
    renamed = 0
    for task_id in (3, 17, 120, 400, 533 + 17):
        obs, obs_shuffled = plain.reset(task_id).observation, shuffled.reset(task_id).observation
        plan, plan_shuffled = textcraft_plan(obs), textcraft_plan(obs_shuffled)
        assert len(plan) == len(plan_shuffled) and obs.count("\n") == obs_shuffled.count("\n")
        renamed += shuffled.goal != plain.goal
        for action in plan_shuffled:
            result = shuffled.step(action)
        assert result.done and result.reward == 1.0
        assert shuffled.reset(task_id).observation == obs_shuffled  # the same id, the same names
        assert shuffled.commands != plain.commands  # other names in the crafting commands
    assert renamed >= 4
    assert plain.reset(17).observation.endswith("Goal: craft " + plain.book.agentgym_goals[17] + ".")


def test_textcraft_agentgym_with_the_servers_goal_order(tmp_path):
    # Goals as AgentGym's own server numbered them here (ids 0, 3, 17: light blue dye, green stained glass, lead).
    order = ["light blue dye", "oak planks", "stick", "green stained glass"] + ["stick"] * 13 + ["lead"]
    path = tmp_path / "goals.json"
    path.write_text(json.dumps({"goals": order}))
    env = TextCraftEnv(task_set="agentgym", goal_order=str(path))
    assert env.reset(3).observation.endswith("Goal: craft green stained glass.")
    assert env.reset(17).observation.endswith("Goal: craft lead.")
    with pytest.raises(EnvError, match="light blue dye.*cannot craft"):
        env.reset(0)  # not in our recipe set: an error naming it, never another goal
    bad = tmp_path / "bad.json"
    bad.write_text('{"goals": []}')
    with pytest.raises(ValueError, match="non-empty list"):
        TextCraftEnv(task_set="agentgym", goal_order=str(bad))


def test_agentgym_rows_have_neutral_prompts():
    for env in ("textcraft", "babyai", "sciworld"):
        for row in task_rows(env, range(0, 80, 7), "agentgym"):
            assert row["env"] == {"server": env, "task_id": row["env"]["task_id"]}
            assert "go forward" not in row["prompt"] and "craft " not in row["prompt"].split(".")[0]
    named = task_rows("babyai", [41], "agentgym", server="babyai_real", goals={41: "go to the red ball"})[0]
    assert named["prompt"].startswith("BabyAI task 41: go to the red ball.") and named["env"]["server"] == "babyai_real"


async def test_agentgym_task_set_over_mcp(open_env):
    async with open_env("babyai.py", "--task-set", "agentgym") as env:
        _, s = await env.call("reset", task_id=41, episode_id="a")
        assert f"Your goal: {minigrid_goal(AGENTGYM_LEVELS[1], 1)}" in s["observation"]
        _, s = await env.call("step", action="go forward", episode_id="a")
        assert s["observation"].startswith(NOT_RECOGNIZED) and not s["done"]
    async with open_env("textcraft.py", "--task-set", "agentgym") as env:
        _, s = await env.call("reset", task_id=0, episode_id="t")
        assert s["observation"].endswith(f"Goal: craft {TextCraftEnv(task_set='agentgym').reset(0).info['goal']}.")


def test_goals_read_off_a_server_match_the_task_set(free_port):
    proc = start_http_server(free_port, "--task-set", "agentgym")
    try:
        url = f"http://127.0.0.1:{free_port}"
        goals = server_goals("textcraft", url, range(0, 40, 3))
        ours = TextCraftEnv(task_set="agentgym")
        assert goals == {i: ours.reset(i).info["goal"] for i in range(0, 40, 3)}
        with EnvClient("textcraft", url) as client:
            assert client.reset(5).info["task_id"] == 5
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_babyai_stand_in_speaks_agentgym_words(free_port):
    proc = start_http_server(free_port, "--task-set", "agentgym", env="babyai")
    try:
        url = f"http://127.0.0.1:{free_port}"
        goals = server_goals("babyai", url, [0, 41])
        assert goals == {0: minigrid_goal(AGENTGYM_LEVELS[0], 0), 41: minigrid_goal(AGENTGYM_LEVELS[1], 1)}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_shipped_agentgym_task_files_match_the_generator():
    tasks = Path(__file__).resolve().parents[2] / "envs" / "tools" / "data" / "tasks"
    for env in ("textcraft", "babyai", "sciworld"):
        rows = [json.loads(line) for line in (tasks / f"{env}_agentgym_train.jsonl").read_text().splitlines()]
        assert rows[:5] == task_rows(env, range(5), "agentgym")
