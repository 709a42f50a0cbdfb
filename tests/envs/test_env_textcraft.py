"""TextCraft over real MCP stdio: reset, scripted solving, helpful errors, episode isolation and cleanup."""
from __future__ import annotations

import pytest

from rlfactory.envs.solvers import textcraft_plan
from rlfactory.envs.textcraft import TextCraftEnv, load_recipe_book


def test_recipe_book_is_sound():
    book = load_recipe_book()
    assert len(book.recipes) >= 300
    assert len(book.goals) >= 100
    assert "oak log" in book.base_items and "stick" not in book.base_items
    # Every goal's recipe tree bottoms out in base items.
    for goal in book.goals[:50]:
        tree = book.tree(goal)
        assert tree[0].output == goal
        made = {r.output for r in tree}
        assert all(i in made or i in book.base_items for r in tree for i, _ in r.inputs)


def test_every_task_is_solvable_from_its_observation_alone():
    env = TextCraftEnv()
    for task_id in range(0, env.num_tasks, 7):
        obs = env.reset(task_id).observation
        result = None
        for action in textcraft_plan(obs):
            result = env.step(action)
        assert result is not None and result.done and result.reward == 1.0, (task_id, env.goal)


def test_the_ask_style_learns_each_recipe_from_the_environments_answer():
    """Style `ask`: a `get` of every craftable item it needs, goal first, is answered with that item's crafting
    command, exactly as the list shows it; every other action succeeds, and the goal is crafted."""
    env = TextCraftEnv(task_set="agentgym")
    for task_id in range(0, env.num_tasks, 5):
        obs = env.reset(task_id).observation
        listed = {line.split(" using ")[0].split(" ", 2)[2]: line for line in obs.splitlines() if " using " in line}
        plan = textcraft_plan(obs, "ask")
        assert plan[0] == f"get 1 {env.goal}"
        asked = []
        for action in plan:
            result = env.step(action)
            if result.observation.startswith("Could not"):
                assert action.startswith("get ") and "it has to be crafted. Its crafting command: " in \
                    result.observation, (task_id, action, result.observation)
                item = action.split(" ", 2)[2]
                assert result.observation.endswith(listed[item]), (task_id, item)
                asked.append(item)
        assert result.done and result.reward == 1.0, (task_id, env.goal)
        assert asked[0] == env.goal and len(asked) == len(set(asked))  # each recipe asked once


def test_an_unknown_demonstration_style_is_refused():
    with pytest.raises(ValueError, match="use plan or ask"):
        textcraft_plan(TextCraftEnv().reset(0).observation, "guess")


def test_same_task_id_same_task():
    a, b = TextCraftEnv(), TextCraftEnv()
    assert a.reset(42).observation == b.reset(42).observation
    assert a.reset(42).observation != a.reset(43).observation


async def test_solver_reaches_reward_1_over_mcp(open_env):
    async with open_env("textcraft.py") as env:
        for task_id in (0, 17, 123):
            text, s = await env.call("reset", task_id=task_id, episode_id=f"t{task_id}")
            assert s["done"] is False and s["task_id"] == task_id and "Goal: craft" in text
            for action in textcraft_plan(s["observation"]):
                text, s = await env.call("step", action=action, episode_id=f"t{task_id}")
                assert "Could not" not in s["observation"], (action, s["observation"])
            assert s["done"] is True and s["reward"] == 1.0 and s["score"] == 1.0
            assert text.startswith("[reward=1 score=1 done=true]")
            _, closed = await env.call("close", episode_id=f"t{task_id}")
            assert closed == {"closed": True, "done": True, "episode_id": f"t{task_id}"}
        assert (await env.stats())["open"] == 0


async def test_bad_actions_get_helpful_observations(open_env):
    async with open_env("textcraft.py") as env:
        _, s = await env.call("step", action="inventory", episode_id="e")
        assert "call reset" in s["observation"]
        await env.call("reset", task_id=3, episode_id="e")
        _, s = await env.call("step", action="dance wildly", episode_id="e")
        assert "Valid actions" in s["observation"] and s["done"] is False
        _, s = await env.call("step", action="get 1 stick", episode_id="e")
        assert "has to be crafted. Its crafting command: craft 4 stick using" in s["observation"]
        _, s = await env.call("step", action="get 2 unobtainium", episode_id="e")
        assert "no such item" in s["observation"]
        _, s = await env.call("step", action="craft 4 stick using 2 oak planks", episode_id="e")
        assert "missing 2 oak planks" in s["observation"]
        _, s = await env.call("step", action="craft 4 stick using 1 oak log", episode_id="e")
        assert "A valid recipe is: craft 4 stick using" in s["observation"]
        _, s = await env.call("step", action="inventory", episode_id="e")
        assert "not carrying anything" in s["observation"] and s["steps"] == 6


async def test_episodes_are_isolated_and_closed(open_env):
    async with open_env("textcraft.py") as env:
        await env.call("reset", task_id=1, episode_id="a")
        await env.call("reset", task_id=2, episode_id="b")
        await env.call("step", action="get 3 oak log", episode_id="a")
        _, sa = await env.call("step", action="inventory", episode_id="a")
        _, sb = await env.call("step", action="inventory", episode_id="b")
        assert "[oak log] (3)" in sa["observation"] and "not carrying" in sb["observation"]
        assert (await env.stats())["open"] == 2
        await env.call("close", episode_id="a")
        _, s = await env.call("observe", episode_id="a")
        assert "No episode is open" in s["observation"]
        _, s = await env.call("observe", episode_id="b")
        assert "Goal: craft" in s["observation"]
        # Without an episode id the connection's own episode is used (plain MCP clients).
        await env.call("reset", task_id=5)
        _, s = await env.call("observe")
        assert "Goal: craft" in s["observation"]
        assert (await env.stats())["open"] == 2
        # The request's _meta may carry the episode id instead of the argument.
        result = await env.session.call_tool("reset", {"task_id": 6}, meta={"rlfactory/episode_id": "m"})
        assert result.structured_content["episode_id"] == "m"
        _, s = await env.call("observe", episode_id="m")
        assert "Goal: craft" in s["observation"] and (await env.stats())["open"] == 3


def test_progress_is_the_share_of_the_goals_craftable_ingredients_crafted():
    """A goal with craftable ingredients reports `progress` with every reset and step: the share of them crafted so
    far, each once. It rises only on the crafts of the tree, reaches 1.0 before the goal is crafted, and a fork keeps
    it; a goal made from base items alone reports none."""
    env = TextCraftEnv(task_set="agentgym")
    deep = next(t for t in range(env.num_tasks) if len(env.book.tree(env.goals[t])) >= 3)
    first = env.reset(deep)
    subgoals = {r.output for r in env.book.tree(env.goal)} - {env.goal}
    assert first.info["progress"] == 0.0 and len(subgoals) >= 2
    seen, crafted = [], set()
    for action in textcraft_plan(first.observation):
        result = env.step(action)
        item = action.split(" using ")[0].split(" ", 2)[2] if action.startswith("craft ") else None
        crafted |= {item} & subgoals
        assert result.info["progress"] == round(len(crafted) / len(subgoals), 4), action
        seen.append(result.info["progress"])
        if 0 < seen[-1] < 1:
            twin = env.fork()
            assert twin.step("inventory").info["progress"] == seen[-1] and twin.state_key() == env.state_key()
    assert result.done and seen[-2] == 1.0 and seen == sorted(seen)
    assert env.step("inventory").info["progress"] == 1.0  # and stays there
    shallow = next(t for t in range(env.num_tasks) if len(env.book.tree(env.goals[t])) == 1)
    assert "progress" not in env.reset(shallow).info


async def test_progress_reaches_the_rollout_side_in_the_structured_content(open_env):
    local = TextCraftEnv()  # the server's task set
    task_id = next(t for t in range(local.num_tasks) if len(local.book.tree(local.goals[t])) >= 3)
    async with open_env("textcraft.py") as env:
        _, s = await env.call("reset", task_id=task_id, episode_id="p")
        assert s["progress"] == 0.0
        progress = [s["progress"]]
        for action in textcraft_plan(s["observation"]):
            _, s = await env.call("step", action=action, episode_id="p")
            progress.append(s["progress"])
        assert s["done"] is True and progress[-1] == 1.0 and progress == sorted(progress) and len(set(progress)) > 2
