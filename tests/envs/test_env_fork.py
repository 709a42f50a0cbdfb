"""Forking an episode (`Env.fork`, the loop-only `fork` tool): the copy starts where its parent is, goes on alone
(acting on it leaves the parent as it was, and the other way round), and replays the parent's future exactly; over
MCP the tool is listed for the loop and hidden from the policy, and refuses what it cannot do."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlfactory.envs.babyai import BabyAIEnv
from rlfactory.envs.deepsearch import DeepSearchEnv
from rlfactory.envs.textcraft import TextCraftEnv

REPO = Path(__file__).resolve().parents[2]


def _base_item(observation: str) -> str:
    """A base item (one `get` gives) among the crafting commands' ingredients."""
    base = TextCraftEnv().book.base_items
    for line in observation.splitlines():
        for part in line.partition(" using ")[2].split(", "):
            item = part.partition(" ")[2]
            if item in base:
                return item
    raise AssertionError(f"no base ingredient in {observation!r}")


def _textcraft() -> tuple[TextCraftEnv, list[str], list[str]]:
    env = TextCraftEnv()
    item = _base_item(env.reset(3).observation)
    return env, [f"get 1 {item}"], [f"get 2 {item}", "inventory"]


def _babyai() -> tuple[BabyAIEnv, list[str], list[str]]:
    env = BabyAIEnv()
    env.reset(2)
    return env, ["turn left", "move forward"], ["turn right", "move forward", "move forward"]


def _deepsearch() -> tuple[DeepSearchEnv, list[str], list[str]]:
    env = DeepSearchEnv()
    env.reset(1)
    return env, ["search: capital"], ["answer: Paris"]


@pytest.mark.parametrize("make", [_textcraft, _babyai, _deepsearch], ids=["textcraft", "babyai", "deepsearch"])
def test_a_fork_starts_where_its_parent_is_and_goes_on_alone(make):
    env, before, after = make()
    for a in before:
        env.step(a)
    key = getattr(env, "state_key", lambda: None)
    start_obs, start_key, start_score = env.observe(), key(), env.score
    twin = env.fork()
    assert twin.observe() == start_obs and getattr(twin, "state_key", lambda: None)() == start_key
    fork_results = [twin.step(a) for a in after]  # the fork moves on ...
    assert env.observe() == start_obs and key() == start_key and env.score == start_score  # ... the parent did not
    parent_results = [env.step(a) for a in after]  # the parent, given the same actions, meets the same future
    assert [r.model_dump() for r in parent_results] == [r.model_dump() for r in fork_results]
    assert env.observe() == twin.observe()
    twin_obs, twin_key, twin_score = twin.observe(), getattr(twin, "state_key", lambda: None)(), twin.score
    env.step(after[0])  # and acting on the parent leaves the fork alone
    assert (twin.observe(), getattr(twin, "state_key", lambda: None)(), twin.score) == (twin_obs, twin_key,
                                                                                        twin_score)


def test_sciworld_forks_by_replaying_its_actions():
    pytest.importorskip("scienceworld")
    from rlfactory.envs.sciworld import SciWorldEnv

    env = SciWorldEnv()
    env.reset(0)
    for a in ["look around", "open door to kitchen", "go to kitchen"]:
        env.step(a)
    twin = env.fork()
    try:
        assert twin.observe() == env.observe() and twin.score == env.score
        twin.step("go to hallway")
        assert twin.observe() != env.observe()
        assert "kitchen" in env._env.look().lower()  # the parent is still in the kitchen
    finally:
        twin.close()
        env.close()


async def test_the_fork_tool_is_the_loops_over_mcp(tmp_path):
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.mcp_configs import load_mcp_configs
    from rlfactory.tools.types import ToolCall

    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps({"mcpServers": {"textcraft": {
        "command": sys.executable, "args": [str(REPO / "envs" / "tools" / "textcraft.py")], "cwd": str(REPO),
        "rlfactory": {"cache": False}}}}))
    async with ToolManager(load_mcp_configs([cfg])) as tools:
        assert [s.name for s in tools.loop_specs] == ["fork"]
        assert "fork" not in {s.name for s in tools.specs}
        assert "fork" not in json.dumps(tools.openai_schemas())
        (reset,) = await tools.call_many([ToolCall(name="reset", arguments={"task_id": 3, "episode_id": "a"})])
        item = _base_item(reset.structured["observation"])
        (step,) = await tools.call_many([ToolCall(name="step", arguments={"action": f"get 1 {item}",
                                                                           "episode_id": "a"})])
        (fork,) = await tools.call_many([ToolCall(name="fork", arguments={"into": "b", "episode_id": "a"})])
        assert not fork.is_error and fork.structured["state"] == step.structured["state"]
        assert fork.structured["episode_id"] == "b"
        (moved,) = await tools.call_many([ToolCall(name="step", arguments={"action": f"get 1 {item}",
                                                                            "episode_id": "b"})])
        assert moved.structured["state"] != step.structured["state"]
        (parent,) = await tools.call_many([ToolCall(name="step", arguments={"action": "inventory",
                                                                             "episode_id": "a"})])
        assert parent.structured["state"] == step.structured["state"]  # the fork's step left the parent alone
        again, missing = await tools.call_many([
            ToolCall(name="fork", arguments={"into": "b", "episode_id": "a"}),
            ToolCall(name="fork", arguments={"into": "c", "episode_id": "nobody"})])
        assert again.is_error and "open already" in again.text
        assert "No episode is open" in missing.text
