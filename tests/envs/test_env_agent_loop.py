"""The AgentLoop driving real environment MCP servers (TextCraft and BabyAI, stdio, from mcp_configs/envs.json).

The policy is `SolverPolicy`, a GenerationEngine that reads its context (token ids in), plays the environment with
the scripted solvers of `solvers.py`, and answers with the token ids of its next tool call (token ids out). The
servers, the ToolManager, the Qwen tokenizer, the chat template, the loop and the reward functions are the real ones.
"""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from rlfactory.envs.solvers import BabyAIShadow, textcraft_plan
from rlfactory.errors import ConfigError
from rlfactory.recipe.rewards import RewardsConfig
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.recipe.tools import ToolsConfig
from rlfactory.report.viewer import render_html
from rlfactory.reward import RewardSet
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.tools.manager import ToolManager

REPO = Path(__file__).resolve().parents[2]
ENVS = ToolsConfig(mcp_configs=[str(REPO / "mcp_configs" / "envs.json")], servers=["textcraft", "babyai"])
TEXTCRAFT = ENVS.model_copy(update={"servers": ["textcraft"]})
TASKS = REPO / "envs" / "tools" / "data" / "tasks"
USER_TURN = "<|im_start|>user\n"


def task_row(env: str, index: int) -> dict[str, Any]:
    with open(TASKS / f"{env}_train.jsonl") as f:
        return [json.loads(line) for line in f][index]


def last_user_turn(context: str) -> str:
    """The text of the last user turn (the reset observation, or the last tool responses)."""
    return context[context.rfind(USER_TURN) + len(USER_TURN):].split("<|im_end|>", 1)[0]


class SolverPolicy:
    """Plays TextCraft and BabyAI from what it reads in its context; one plan per trajectory (by request id).

    `policy_episode_id`: an `episode_id` the policy writes into every call (the loop must override it).
    `fail_at_turn`: raise on that turn (a failing engine), `answer_after`: stop calling tools after that many turns.
    """

    def __init__(self, tok: Any, *, policy_episode_id: str | None = None, fail_at_turn: int | None = None,
                 answer_after: int | None = None, first_call: dict[str, Any] | None = None):
        self.tok = tok
        self.policy_episode_id = policy_episode_id
        self.fail_at_turn = fail_at_turn
        self.answer_after = answer_after
        self.first_call = first_call
        self.plans: dict[str, Callable[[str], str]] = {}
        self.contexts: list[str] = []
        self.outputs: dict[str, list[int]] = {}

    def _planner(self, context: str) -> Callable[[str], str]:
        obs = last_user_turn(context)
        if "Goal: craft" in context:
            # a branch starts mid-episode: the plan of its reset observation, past the steps its root took
            start = context.rfind(USER_TURN, 0, context.index("Goal: craft")) + len(USER_TURN)
            reset = context[start:].split("<|im_end|>", 1)[0]
            actions = iter(textcraft_plan(reset)[context.count('<tool_call>\n{"name": "textcraft.step"'):])
            return lambda _obs: next(actions)
        level = obs.split("Level: ", 1)[1].split("\n", 1)[0]
        task_id = int(re.search(r"BabyAI task (\d+)\.", context).group(1))
        shadow = BabyAIShadow(level, task_id)
        return lambda _obs: shadow.next_action()

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.policy_episode_id is not None:
            arguments = {**arguments, "episode_id": self.policy_episode_id}
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       request_id: str | None = None) -> GenerationOutput:
        await asyncio.sleep(0)  # let the trajectories interleave on the shared servers
        traj_id, turn = request_id.rsplit("#", 1)
        turn_n = int(turn)
        if turn_n == self.fail_at_turn:
            raise RuntimeError("engine failure (scripted)")
        context = self.tok.decode(prompt_ids)
        self.contexts.append(context)
        if self.first_call is not None and turn_n == 0:
            text = self._call(**self.first_call)
        elif self.answer_after is not None and turn_n >= self.answer_after:
            text = "I stop here."
        else:
            if traj_id not in self.plans:
                self.plans[traj_id] = self._planner(context)
            env = "textcraft" if re.search(r"TextCraft task \d+:", context) else "babyai"
            text = self._call(f"{env}.step", {"action": self.plans[traj_id](last_user_turn(context))})
        ids = self.tok.encode(text + "<|im_end|>", add_special_tokens=False)
        self.outputs[request_id] = ids
        return GenerationOutput(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    async def update_weights(self, state_dict: Any) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tok():
    from rlfactory.models.tokenizer import load_qwen_tokenizer

    return load_qwen_tokenizer()


def cfg(**kw: Any) -> RolloutConfig:
    base = dict(max_context_tokens=32768, max_response_tokens=30000, tool_response_max_tokens=1024,
                max_tool_calls_per_turn=1, horizon={"type": "fixed", "turns": 80},
                sampling={"temperature": 1.0, "max_new_tokens_per_turn": 64})
    base.update(kw)
    return RolloutConfig(**base)


async def open_episodes(tools: ToolManager) -> dict[str, int]:
    """Each env server's own count of open episodes (its `rlfactory://episodes` resource, over the live session)."""
    counts = {}
    for name, server in tools.servers.items():
        (conn,) = server.connections
        res = await conn.session.read_resource("rlfactory://episodes")
        counts[name] = json.loads(res.contents[0].text)["open"]
    return counts


def check_tokens(t: Trajectory, policy: SolverPolicy) -> None:
    """Assistant spans are exactly the engine's ids, tool spans have mask 0, spans tile the response."""
    assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)
    pos, turn = 0, 0
    for span in t.turns:
        assert span.start == pos
        ids = t.response_ids[span.start:span.end]
        if span.role == "assistant":
            assert ids == policy.outputs[f"{t.id}#{turn}"] and set(t.loss_mask[span.start:span.end]) == {1}
            turn += 1
        else:
            assert set(t.loss_mask[span.start:span.end]) == {0}
        pos = span.end
    assert pos == len(t.response_ids)


async def test_episodes_per_trajectory_done_ends_and_env_reward_scores(tok):
    tasks = [task_row("textcraft", 0), task_row("textcraft", 17), task_row("babyai", 0)]
    async with ToolManager.from_recipe(ENVS) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        # Every call the policy writes names the same episode: only the loop's binding keeps them apart.
        policy = SolverPolicy(tok, policy_episode_id="shared")
        trajs, metrics = await AgentLoop(policy, tools, chat, cfg()).run_batch(tasks, samples_per_prompt=2)
        after = await open_episodes(tools)
    assert after == {"textcraft": 0, "babyai": 0}

    assert [t.finish_reason for t in trajs] == ["env_done"] * 6, [(t.finish_reason, t.error) for t in trajs]
    assert metrics["rollout/finish_env_done"] == 6 and metrics["rollout/errors"] == 0
    episodes = set()
    for t in trajs:
        check_tokens(t, policy)
        # The reset observation is in the prompt (a user message), not a policy turn.
        prompt = tok.decode(t.prompt_ids)
        assert ("Goal: craft" in prompt) or ("Mission:" in prompt)
        assert t.messages[-1]["role"] == "tool" and t.turns[-1].role == "tool"
        last = t.tool_calls[-1].structured
        assert last is not None and last["done"] is True and last["score"] > 0
        assert last["task_id"] == t.task["env"]["task_id"]
        ids = {c.structured["episode_id"] for c in t.tool_calls}
        assert len(ids) == 1 and next(iter(ids)).startswith(t.id + "~")
        episodes |= ids
        assert all(c.arguments["episode_id"] == "shared" for c in t.tool_calls)  # recorded as the policy wrote it
        assert not any(c.is_error for c in t.tool_calls)
    assert len(episodes) == 6  # two samples of one task never share an episode

    rewards = RewardSet.from_config(RewardsConfig(functions=[
        {"function": "env_score", "weight": 1.0}, {"function": "env_success", "weight": 0.0}]), REPO)
    reward_metrics = await rewards.score(trajs)
    textcraft = [t for t in trajs if t.task["env"]["server"] == "textcraft"]
    babyai = [t for t in trajs if t.task["env"]["server"] == "babyai"]
    assert [t.reward for t in textcraft] == [1.0] * 4
    assert all(t.reward_components["env_success"] == 1.0 for t in textcraft)
    assert all(0.0 < t.reward < 1.0 for t in babyai)  # minigrid: 1 - 0.9 * steps / max_steps
    assert reward_metrics["reward/errors"] == 0.0
    page = render_html(trajs)
    assert page.count('<span class="badge env_done">env_done</span>') == 6


async def test_the_policy_never_sees_episode_id(tok):
    async with ToolManager.from_recipe(TEXTCRAFT) as tools:
        step = tools.resolve("step")
        assert step is not None and "episode_id" in step.input_schema["properties"]  # the server does take it
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        policy = SolverPolicy(tok)
        traj = await AgentLoop(policy, tools, chat, cfg()).run_one(task_row("textcraft", 3))
        assert await open_episodes(tools) == {"textcraft": 0}
    assert traj.finish_reason == "env_done", traj.error
    system = tok.decode(traj.prompt_ids)
    assert '"name": "step"' in system and '"action"' in system and "episode_id" not in system
    assert all("episode_id" not in context for context in policy.contexts)
    assert all("episode_id" not in (c.arguments or {}) for c in traj.tool_calls)


async def test_episodes_close_whatever_ends_the_trajectory(tok):
    # No `env` in the row: the policy opens the episode itself; the calls are bound all the same.
    free_row = {"id": "free", "prompt": "Play TextCraft task 5."}
    async with ToolManager.from_recipe(ENVS) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        opener = SolverPolicy(tok, first_call={"name": "textcraft.reset", "arguments": {"task_id": 5}},
                              answer_after=1)
        stopped = await AgentLoop(opener, tools, chat, cfg()).run_one(free_row)
        assert await open_episodes(tools) == {"textcraft": 0, "babyai": 0}

        failing = SolverPolicy(tok, fail_at_turn=2)  # two steps into each episode, the engine raises
        errored, _ = await AgentLoop(failing, tools, chat, cfg()).run_batch(
            [task_row("textcraft", 1), task_row("babyai", 1)], samples_per_prompt=1)
        assert await open_episodes(tools) == {"textcraft": 0, "babyai": 0}

        short = SolverPolicy(tok)
        horizon_hit, _ = await AgentLoop(short, tools, chat, cfg(horizon={"type": "fixed", "turns": 2})).run_batch(
            [task_row("textcraft", 2), task_row("babyai", 2)], samples_per_prompt=1)
        assert await open_episodes(tools) == {"textcraft": 0, "babyai": 0}

    assert stopped.finish_reason == "stop" and len(stopped.tool_calls) == 1
    reset = stopped.tool_calls[0]
    assert reset.name == "textcraft.reset" and reset.structured["task_id"] == 5
    assert reset.structured["episode_id"].startswith("free/0~")
    assert [t.finish_reason for t in errored] == ["error", "error"]
    assert all("engine failure" in t.error and len(t.tool_calls) == 2 for t in errored)
    assert [t.finish_reason for t in horizon_hit] == ["max_turns", "max_turns"]


async def test_a_failed_reset_is_a_counted_error_never_an_observation(tok, tmp_path, free_port):
    # The AgentGym bridge in front of a closed port: the task's reset fails before the first turn.
    cfg_file = tmp_path / "dead.json"
    cfg_file.write_text(json.dumps({"mcpServers": {"textcraft": {
        "command": "python", "args": [str(REPO / "envs/tools/agentgym_bridge.py"), "--url",
                                      f"http://127.0.0.1:{free_port}", "--env", "textcraft", "--timeout-s", "2"],
        "rlfactory": {"cache": False}}}}))
    dead = ToolsConfig(mcp_configs=[str(cfg_file)], servers=["textcraft"])
    async with ToolManager.from_recipe(dead) as tools:
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        policy = SolverPolicy(tok)
        trajs, metrics = await AgentLoop(policy, tools, chat, cfg()).run_batch(
            [task_row("textcraft", 0), task_row("textcraft", 1)], samples_per_prompt=1)
    assert [t.finish_reason for t in trajs] == ["error", "error"]
    assert metrics["rollout/errors"] == 2
    assert all("could not open the task's episode" in t.error and "is the server running" in t.error for t in trajs)
    assert policy.contexts == []  # the policy never read the failure as an observation


class GoalWordsPolicy(SolverPolicy):
    """Plays AgentGym-style BabyAI GoTo tasks from the words it reads: `go to <colour> <type> 1` for the goal."""

    def _planner(self, context: str) -> Callable[[str], str]:
        obs = last_user_turn(context)
        target = re.search(r"^Your goal: go to (?:the|a) (.+)$", obs, re.M).group(1)
        return lambda _obs: f"go to {target} 1"

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       request_id: str | None = None) -> GenerationOutput:
        traj_id, _ = request_id.rsplit("#", 1)
        context = self.tok.decode(prompt_ids)
        self.contexts.append(context)
        if traj_id not in self.plans:
            self.plans[traj_id] = self._planner(context)
        text = self._call("babyai.step", {"action": self.plans[traj_id](last_user_turn(context))})
        ids = self.tok.encode(text + "<|im_end|>", add_special_tokens=False)
        self.outputs[request_id] = ids
        return GenerationOutput(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


async def test_agentgym_rows_through_the_bridge_to_an_agentgym_style_server(tok, tmp_path, free_port):
    # The stand-in AgentGym BabyAI server (its reply shapes, AgentGym's task ids and action words) behind the real
    # bridge; the rows are the shipped agentgym rows, whose prompts name no action the server lacks.
    from test_env_bridge import start_http_server

    proc = start_http_server(free_port, "--task-set", "agentgym", env="babyai")
    try:
        cfg_file = tmp_path / "agentgym.json"
        cfg_file.write_text(json.dumps({"mcpServers": {"babyai": {
            "command": "python", "args": [str(REPO / "envs/tools/agentgym_bridge.py"), "--url",
                                          f"http://127.0.0.1:{free_port}", "--env", "babyai"],
            "rlfactory": {"cache": False}}}}))
        with open(TASKS / "babyai_agentgym_train.jsonl") as f:
            rows = [json.loads(line) for line in f]
        tasks = [rows[1], rows[2]]  # GoToRedBall, GoToRedBallNoDists (seed 0)
        async with ToolManager.from_recipe(ToolsConfig(mcp_configs=[str(cfg_file)], servers=["babyai"])) as tools:
            chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
            policy = GoalWordsPolicy(tok)
            trajs, metrics = await AgentLoop(policy, tools, chat, cfg()).run_batch(tasks, samples_per_prompt=1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert metrics["rollout/errors"] == 0 and [t.finish_reason for t in trajs] == ["env_done"] * 2, [
        (t.finish_reason, t.error) for t in trajs]
    for t in trajs:
        prompt = tok.decode(t.prompt_ids)
        assert "Your goal: go to the red ball" in prompt and "Available actions: [" in prompt
        assert "go forward" not in prompt
        last = t.tool_calls[-1].structured
        assert last["done"] and last["reward"] > 0 and last["task_id"] == t.task["env"]["task_id"]


async def test_a_rollout_never_opens_more_episodes_than_its_server_holds(tok):
    """A server that holds 3 episodes (`--max-episodes 3`, advertised in its tool list) and a batch of 8
    trajectories, flat and then as branched trees of 2: the loop keeps no more in flight than the server holds, so it
    evicts none and every trajectory finishes its episode (without the bound, 8 interleaved trajectories on 3 slots
    evict each other's episodes mid-play)."""
    small = TEXTCRAFT.model_copy(update={"server_args": {"textcraft": ["--max-episodes", "3"]}})
    tasks = [task_row("textcraft", i) for i in range(4)]
    async with ToolManager.from_recipe(small) as tools:
        assert {s.max_episodes for s in [*tools.specs, *tools.loop_specs]} == {3}
        chat = ChatFormat(tok, tools.openai_schemas(), enable_thinking=False)
        flat, _ = await AgentLoop(SolverPolicy(tok), tools, chat, cfg()).run_batch(tasks, samples_per_prompt=2)
        branched, _ = await AgentLoop(SolverPolicy(tok), tools, chat, cfg(branching={"width": 2, "at_turn": 1})
                                      ).run_batch(tasks, samples_per_prompt=2, branching=True)
        (conn,) = tools.servers["textcraft"].connections
        stats = json.loads((await conn.session.read_resource("rlfactory://episodes")).contents[0].text)
        assert stats["evicted_total"] == 0
        assert [t.finish_reason for t in flat + branched] == ["env_done"] * 16, [t.error for t in flat + branched]
        assert sum(t.branch is not None and t.branch.child > 0 for t in branched) == 4  # a fork per tree
        # A tree wider than the server holds could never have its branches open together: refused, with the fix.
        too_wide = AgentLoop(SolverPolicy(tok), tools, chat, cfg(branching={"width": 4, "at_turn": 1}))
        with pytest.raises(ConfigError, match="branching.width"):
            await too_wide.run_batch(tasks[:1], samples_per_prompt=4, branching=True)
