"""ScienceWorld over real MCP stdio (one JVM in the server, one in the test for the gold path): few tests, the JVM
start-up is the cost."""
from __future__ import annotations

import pytest

pytest.importorskip("scienceworld")

TASK = "find-living-thing"  # short gold path (about a dozen actions)


def gold_actions(task: str, variation: int) -> list[str]:
    """The simulator's own gold path, generated in this process (the server never hands it to the policy)."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", envStepLimit=100)
    try:
        env.load(task, variation, "", generateGoldPath=True)
        env.reset()
        return list(env.get_gold_action_sequence())
    finally:
        env.close()


@pytest.mark.slow
async def test_sciworld_gold_path_scores_1_and_bad_actions_get_hints(open_env):
    variation = 1
    actions = gold_actions(TASK, variation)
    assert actions and not actions[0].startswith("ERROR")
    async with open_env("sciworld.py", env={"RLFACTORY_SCIWORLD_TASKS": TASK}) as env:
        assert (await env.stats())["open"] == 0  # lazy: no JVM until the first reset
        _, s = await env.call("reset", task_id=variation, episode_id="s")  # one task: task_id = variation
        assert "find a(n) living thing" in s["observation"] and s["task_id"] == variation
        _, s = await env.call("step", action="fly to the moon", episode_id="s")
        assert "Action templates" in s["observation"] and "look around" in s["observation"]
        assert not s["done"] and s["score"] == 0.0
        for action in actions:
            _, s = await env.call("step", action=action, episode_id="s")
        assert s["done"] and s["score"] == 1.0, s
        _, closed = await env.call("close", episode_id="s")
        assert closed["closed"] and (await env.stats())["open"] == 0
