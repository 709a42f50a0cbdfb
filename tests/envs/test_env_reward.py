"""The environment's reward reaching the reward functions, through the real ToolManager and mcp_configs/envs.json."""
from __future__ import annotations

from pathlib import Path

from rlfactory.envs.solvers import textcraft_plan
from rlfactory.rewards.env import env_progress, env_return, env_score, env_status, env_step_rewards, env_success
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.mcp_configs import load_mcp_configs
from rlfactory.tools.types import ToolCall

REPO = Path(__file__).resolve().parents[2]
ENVS_JSON = REPO / "mcp_configs" / "envs.json"


def test_envs_config_never_caches():
    configs = load_mcp_configs([ENVS_JSON])
    assert set(configs) == {"textcraft", "babyai", "sciworld", "deepsearch"}
    assert all(cfg.settings.cache is False for cfg in configs.values())


def test_status_parsing_from_text_and_structured():
    text_only = ToolCallRecord(turn=0, name="step", result="[reward=0.5 score=0.5 done=false]\nobs")
    assert env_status(text_only) == {"reward": 0.5, "score": 0.5, "done": False}
    structured = ToolCallRecord(turn=1, name="step", result="", structured={"reward": 1, "score": 1, "done": True})
    assert env_status(structured) == {"reward": 1.0, "score": 1.0, "done": True}
    assert env_status(ToolCallRecord(turn=0, name="calculator", result="42")) is None
    closing = ToolCallRecord(turn=2, name="close", result="Episode closed.", structured={"closed": True, "done": True})
    assert env_status(closing) is None  # a close after the last step must not zero the score
    traj = Trajectory(id="t", prompt_ids=[1], tool_calls=[text_only, structured, closing])
    assert env_score(traj) == 1.0 and env_success(traj) == 1.0 and env_return(traj) == 1.5
    assert env_score(Trajectory(id="empty", prompt_ids=[1])) == 0.0


def test_step_rewards_are_summed_per_assistant_turn():
    turns = [TurnSpan(role=r, start=i, end=i + 1) for i, r in enumerate(["assistant", "tool"] * 3)]
    calls = [ToolCallRecord(turn=0, name="step", result="[reward=0.25 score=0.25 done=false]"),
             ToolCallRecord(turn=0, name="step", result="[reward=0.25 score=0.5 done=false]"),
             ToolCallRecord(turn=2, name="step", result="[reward=0.5 score=1 done=true]")]
    traj = Trajectory(id="s", prompt_ids=[1], turns=turns, tool_calls=calls)
    assert env_step_rewards(traj) == [0.5, 0.0, 0.5]


def test_progress_rises_are_paid_once_on_the_turn_that_reached_them():
    turns = [TurnSpan(role=r, start=i, end=i + 1) for i, r in enumerate(["assistant", "tool"] * 4)]
    calls = [ToolCallRecord(turn=0, name="step", result="", structured={"progress": 0.0, "score": 0}),
             ToolCallRecord(turn=1, name="step", result="", structured={"progress": 0.5, "score": 0}),
             ToolCallRecord(turn=1, name="step", result="", structured={"progress": 1.0, "score": 0}),
             ToolCallRecord(turn=2, name="step", result="", structured={"progress": 0.5, "score": 0}),  # left it
             ToolCallRecord(turn=3, name="step", result="", structured={"progress": 1.0, "score": 1}),  # back again
             ToolCallRecord(turn=3, name="step", result="Error", is_error=True, structured={"progress": 9.0})]
    traj = Trajectory(id="p", prompt_ids=[1], turns=turns, tool_calls=calls)
    assert env_progress(traj) == [0.0, 1.0, 0.0, 0.0]
    plain = Trajectory(id="q", prompt_ids=[1], turns=turns, tool_calls=[
        ToolCallRecord(turn=0, name="step", result="[reward=1 score=1 done=true]")])
    assert env_progress(plain) == [0.0, 0.0, 0.0, 0.0]  # an environment that reports none


async def test_env_reward_of_a_real_episode_through_the_tool_manager():
    async with ToolManager.from_files([ENVS_JSON]) as tools:
        step_spec = tools.resolve("textcraft.step")
        assert step_spec is not None and not step_spec.read_only and not step_spec.idempotent
        eid = "traj-0"
        reset = await tools.call(ToolCall(name="textcraft.reset", arguments={"task_id": 8, "episode_id": eid}))
        records = []
        for turn, action in enumerate(textcraft_plan(reset.structured["observation"])):
            r = await tools.call(ToolCall(name="textcraft.step", arguments={"action": action, "episode_id": eid}))
            assert not r.cached
            records.append(ToolCallRecord(turn=turn, name=r.name, arguments={"action": action}, result=r.text,
                                          is_error=r.is_error, structured=r.structured))
        await tools.call(ToolCall(name="textcraft.close", arguments={"episode_id": eid}))
    traj = Trajectory(id=eid, prompt_ids=[1], tool_calls=records)
    assert records[-1].structured["done"] is True
    assert env_score(traj) == 1.0 and env_success(traj) == 1.0
    # The same trajectory recorded without structured content (text only) scores the same.
    text_only = traj.model_copy(update={"tool_calls": [r.model_copy(update={"structured": None}) for r in records]})
    assert env_score(text_only) == 1.0
