"""BabyAI over real MCP stdio: text observations, named actions, solving with minigrid's planner, bad actions."""
from __future__ import annotations

import numpy as np

from rlfactory.envs.babyai import ACTIONS, DEFAULT_LEVELS, BabyAIEnv, describe_view
from rlfactory.envs.solvers import BabyAIShadow


def test_describe_view_positions_objects_relative_to_the_agent():
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = OBJECT_TO_IDX["empty"]
    image[3, 4] = (OBJECT_TO_IDX["ball"], COLOR_TO_IDX["red"], 0)  # 2 ahead
    image[5, 6] = (OBJECT_TO_IDX["key"], COLOR_TO_IDX["blue"], 0)  # 2 to the right
    image[1, 5] = (OBJECT_TO_IDX["door"], COLOR_TO_IDX["green"], STATE_TO_IDX["locked"])  # 1 ahead, 2 left
    text = describe_view(image, "a grey box", "go to the red ball")
    assert "Mission: go to the red ball" in text
    assert "a red ball 2 steps forward" in text
    assert "a blue key 2 steps right" in text
    assert "a locked green door 1 step forward and 2 steps left" in text
    assert "Directly in front of you: nothing" in text and "carrying a grey box" in text


def test_same_task_id_same_layout():
    a, b = BabyAIEnv(), BabyAIEnv()
    assert a.reset(9).observation == b.reset(9).observation
    assert a.level == DEFAULT_LEVELS[9 % len(DEFAULT_LEVELS)]


async def test_planner_solves_tasks_over_mcp(open_env):
    async with open_env("babyai.py") as env:
        for task_id in (0, 4, 5):  # GoToRedBallGrey, PickupLoc, OpenDoor
            _, s = await env.call("reset", task_id=task_id, episode_id="b")
            assert s["observation"].startswith("Level: BabyAI-") and "Mission:" in s["observation"]
            level = s["observation"].splitlines()[0].split(": ", 1)[1]
            shadow = BabyAIShadow(level, task_id)
            for _ in range(200):
                action = shadow.next_action()
                assert action in ACTIONS
                text, s = await env.call("step", action=action, episode_id="b")
                if s["done"]:
                    break
            assert s["done"] and s["reward"] > 0 and s["score"] == s["reward"], (task_id, s)
            assert "Mission complete!" in text


async def test_bad_actions_and_finished_episodes(open_env):
    async with open_env("babyai.py") as env:
        await env.call("reset", task_id=1, episode_id="x")
        _, s = await env.call("step", action="fly", episode_id="x")
        assert "Unknown action 'fly'" in s["observation"] and "turn left" in s["observation"]
        assert "Mission:" in s["observation"] and not s["done"]
        _, s = await env.call("step", action="forward", episode_id="x")  # alias of `go forward`
        assert "Unknown action" not in s["observation"] and s["steps"] == 2
        _, closed = await env.call("close", episode_id="x")
        assert closed["closed"] is True
        assert (await env.stats())["open"] == 0
