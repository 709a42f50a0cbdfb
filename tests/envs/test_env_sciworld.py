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


@pytest.mark.slow
def test_sciworld_agentgym_task_ids_follow_the_servers_list():
    # AgentGym's SciWorld server: one flat list, task by task in ScienceWorld's order, every variation of each,
    # without the task ids 5-1, 5-2, 9-1, 9-2, 9-3, 10-1, 10-2; data_idx indexes it.
    from scienceworld import ScienceWorldEnv
    from scienceworld.constants import ID2TASK

    from rlfactory.envs.sciworld import SciWorldEnv
    from rlfactory.envs.tasks import SCIWORLD_TASKS
    from rlfactory.envs.types import EnvError

    assert list(SCIWORLD_TASKS) == list(ID2TASK.values())  # the prompts' task names follow the simulator's order
    left_out = {"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"}
    ref = ScienceWorldEnv("", envStepLimit=100)
    try:
        expected = [(name, v) for key, name in ID2TASK.items() if key not in left_out
                    for v in range(ref.get_max_variations(name))]
    finally:
        ref.close()
    env = SciWorldEnv(task_set="agentgym")
    try:
        for i in (0, 1, len(expected) // 2, len(expected) - 1):
            first = env.reset(i)
            assert (first.info["task_name"], first.info["variation"]) == expected[i]
            assert first.observation.startswith("Your task is to")
        with pytest.raises(EnvError, match=f"{len(expected)} tasks"):
            env.reset(len(expected))
    finally:
        env.close()
    assert not {"grow-plant", "inclined-plane-determine-angle", "mendelian-genetics-known-plant"} & {
        name for name, _ in expected}


@pytest.mark.slow
async def test_sciworld_agentgym_task_set_over_mcp(open_env):
    async with open_env("sciworld.py", "--task-set", "agentgym") as env:
        _, s = await env.call("reset", task_id=14, episode_id="a")  # boil has 30 variations: id 14 is boil's 15th
        assert s["task_id"] == 14 and s["observation"].startswith("Your task is to boil")
        result = await env.session.call_tool("reset", {"task_id": 10**6, "episode_id": "b"})
        assert result.is_error and "AgentGym's task list has" in result.content[0].text
