"""Demonstrations in environments: a scripted solver plays tasks through the REAL environment MCP server.

Each demonstration is an episode exactly as the AgentLoop would hold it: the task prompt, the `reset` observation as
a user message (the loop opens a task's episode before the first turn and shows what it returns), then per action an
assistant `<tool_call>` to the server's `step` tool and the tool response text the loop would show (the server's
status line and observation; chat markup in it is neutralised when the transcript is encoded, by
`ChatFormat.tool_response_delta`). The episode id is filled in the way the loop fills it and
never appears in the transcript. Only episodes the solver finishes with success within `max_turns - 1` actions are
kept (the loop runs no call on a trajectory's last turn); the others are counted and dropped, so every demonstration
is right by construction.

Solvers (rlfactory/envs/solvers.py), chosen per demo set by `policy`:
- `textcraft`: `textcraft_plan` on the reset observation, style `plan` (reads the list) or `ask` (a `get` of each
  item first, whose answer names a craftable item's crafting command);
- `babyai`: `BabyAIWords` on AgentGym's action words, style `walk` (the level planner's single steps) or `macro`
  (AgentGym's go to / pickup / toggle macros where they cover the goal), or `BabyAISearch`, style `search` (the
  shortest solution within `max_turns - 1` words, found on forks of a private copy: it opens the right door first
  time); a set mixes styles by `styles` weights;
- `web`: the task's plan (rlfactory/envs/web/demonstrator.py), each step found by its id in the last observation,
  style `plan`; the task is the one the server says its `reset` opened (the `task_id` of its result, whatever the
  server's split, templates and held-out id offset), of the content seed the server's reset reports (else the
  row's `env.seed`, default 0).

Left out: SciWorld and Deep Search demonstrators (no scripted solver for them yet).
"""
from __future__ import annotations

import asyncio
import random
from typing import Any, Callable, Sequence

from rlfactory.envs.protocol import EPISODE_ARG, close_calls, reset_call, task_env
from rlfactory.envs.solvers import BabyAISearch, BabyAIWords, textcraft_plan
from rlfactory.rollout.gate import TrajectoryGate
from rlfactory.tools.format import response_text
from rlfactory.tools.types import ToolCall, ToolSpec
from rlfactory.warmup.demos import render_tool_call

ENV_POLICIES = {"textcraft": ("plan", "ask"), "babyai": ("walk", "macro", "search"), "web": ("plan",)}
"""Demonstrator policies for environment tasks and the styles each knows."""


class _TextCraftSolver:
    def __init__(self, task: dict[str, Any], style: str, max_actions: int):
        self.style = style
        self.plan: list[str] | None = None
        self.stuck = False

    def first(self, observation: str, opened: dict[str, Any]) -> None:
        self.plan = textcraft_plan(observation, self.style)

    def next_action(self) -> str:
        assert self.plan is not None
        if not self.plan:
            self.stuck = True
            return "inventory"
        return self.plan.pop(0)

    def step(self, word: str) -> None:
        pass


class _BabyAISolver:
    def __init__(self, task: dict[str, Any], style: str, max_actions: int):
        task_id = int(_env(task)["task_id"])
        self.words = BabyAISearch(task_id, max_actions) if style == "search" else BabyAIWords(task_id, style)

    @property
    def stuck(self) -> bool:
        return self.words.stuck

    def first(self, observation: str, opened: dict[str, Any]) -> None:
        pass

    def next_action(self) -> str:
        return self.words.next_action()

    def step(self, word: str) -> None:
        self.words.step(word)


class _WebSolver:
    """Reads every observation (`see`): each plan step's element id is found in the page it acts on."""

    def __init__(self, task: dict[str, Any], style: str, max_actions: int):
        self.seed = int(_env(task).get("seed", 0))
        self.policy: Any = None
        self.observation = ""
        self.stuck = False

    def first(self, observation: str, opened: dict[str, Any]) -> None:
        from rlfactory.envs.web.demonstrator import PlanDemonstrator
        from rlfactory.envs.web.env import configs_by_id

        # The plan of the task the server opened, of the content seed its reset reports (else the row's); the
        # observation must state its intent.
        self.seed = int(opened.get("content_seed", self.seed))
        config = configs_by_id(self.seed).get(opened.get("task_id"))  # type: ignore[arg-type]
        self.stuck = config is None or not observation.startswith(f"Task: {config['intent']}\n")
        self.observation = observation
        if not self.stuck:
            self.policy = PlanDemonstrator(config)

    def next_action(self) -> str:
        from rlfactory.envs.web.demonstrator import DemoStuck

        try:
            return self.policy.next_action(self.observation)
        except DemoStuck:
            self.stuck = True
            return "scroll [down]"

    def see(self, observation: str) -> None:
        self.observation = observation

    def step(self, word: str) -> None:
        pass


_SOLVERS = {"textcraft": _TextCraftSolver, "babyai": _BabyAISolver, "web": _WebSolver}


def _env(task: dict[str, Any]) -> dict[str, Any]:
    env = task_env(task)
    if not isinstance(env, dict) or "server" not in env:
        raise ValueError(f"task {task.get('id')!r} names no environment (`env: {{server, task_id}}`)")
    return env


def _step_spec(specs: Sequence[ToolSpec], server: str) -> ToolSpec:
    spec = next((s for s in specs if s.server == server and s.tool == "step"), None)
    if spec is None:
        raise ValueError(f"no `step` tool on server {server!r}: add the environment server to tools.servers")
    return spec


async def play_episode(task: dict[str, Any], manager: Any, policy: str, style: str, *, max_turns: int,
                       episode_id: str) -> tuple[dict[str, Any] | None, str]:
    """One demonstration of `task` through `manager` (a started ToolManager), or (None, why) when the solver did
    not succeed within `max_turns` turns."""
    specs = list(manager.specs)
    server = _env(task)["server"]
    step = _step_spec(specs, server)
    reset = reset_call(task, specs, episode_id)
    if reset is None:
        raise ValueError(f"no `reset` tool for task {task.get('id')!r} on server {server!r}")
    solver = _SOLVERS[policy](task, style, max_actions=max_turns - 1)
    (opened,) = await manager.call_many([reset])
    if opened.is_error:
        return None, "reset_error"
    observation = (opened.structured or {}).get("observation")
    observation = observation if isinstance(observation, str) else response_text(opened)
    solver.first(observation, opened.structured or {})
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["prompt"]},
                                      {"role": "user", "content": observation}]
    try:
        for turn in range(max_turns - 1):
            if solver.stuck:  # the first observation already said it cannot go on
                return None, "solver_stuck"
            word = solver.next_action()
            if solver.stuck:
                return None, "solver_stuck"
            call = ToolCall(name=step.name, arguments={"action": word, EPISODE_ARG: episode_id},
                            id=f"{episode_id}#{turn}")
            (result,) = await manager.call_many([call])
            if result.is_error:
                return None, "step_error"
            solver.step(word)
            see = getattr(solver, "see", None)
            if see is not None:  # a solver that reads each observation (the web's)
                structured_obs = (result.structured or {}).get("observation")
                see(structured_obs if isinstance(structured_obs, str) else response_text(result))
            messages.append({"role": "assistant", "content": render_tool_call(step.name, {"action": word})})
            messages.append({"role": "tool", "name": step.name, "content": response_text(result)})
            structured = result.structured or {}
            if structured.get("done"):
                return ({"id": task.get("id"), "style": style, "answer": None, "messages": messages,
                         "env": _env(task), "actions": turn + 1}, "ok") if float(structured.get("score", 0)) > 0 \
                    else (None, "failed")
        return None, "too_long"
    finally:
        await manager.call_many(close_calls(specs, [server], episode_id))


async def generate_env_demos(tasks: Sequence[dict[str, Any]], manager: Any, *, policy: str,
                             styles: dict[str, float], max_turns: int, seed: int = 0,
                             system_prompt: str | None = None, concurrency: int = 8,
                             on_episode: Callable[[int, int], None] | None = None,
                             ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Demonstrations of `tasks` by `policy`, each task's style drawn by the `styles` weights. Returns the kept
    transcripts (in task order) and counts: kept per style, and dropped by reason. `on_episode(played, kept)` is
    called as each episode ends."""
    if policy not in ENV_POLICIES:
        raise ValueError(f"unknown environment demonstrator {policy!r}: use one of {', '.join(ENV_POLICIES)}")
    unknown = set(styles) - set(ENV_POLICIES[policy])
    if unknown or not styles:
        raise ValueError(f"{policy} demonstrations know the styles {', '.join(ENV_POLICIES[policy])}; "
                         f"got {', '.join(sorted(unknown)) or 'none'}")
    rng = random.Random(seed)
    names, weights = list(styles), [styles[s] for s in styles]
    drawn = [rng.choices(names, weights)[0] for _ in tasks]
    gate = TrajectoryGate.sized(concurrency, manager)
    counts = [0, 0]  # played, kept

    async def one(i: int) -> tuple[dict[str, Any] | None, str]:
        async with gate.one():
            outcome = await play_episode(tasks[i], manager, policy, drawn[i], max_turns=max_turns,
                                         episode_id=f"demo-{seed}-{i}")
        counts[0] += 1
        counts[1] += outcome[0] is not None
        if on_episode is not None:
            on_episode(counts[0], counts[1])
        return outcome

    outcomes = await asyncio.gather(*(one(i) for i in range(len(tasks))))
    tools = manager.openai_schemas()
    demos: list[dict[str, Any]] = []
    stats: dict[str, float] = {}
    for demo, why in outcomes:
        if demo is None:
            stats[f"dropped_{why}"] = stats.get(f"dropped_{why}", 0) + 1
            continue
        if system_prompt:
            demo["messages"].insert(0, {"role": "system", "content": system_prompt})
        demo["tools"] = tools
        stats[demo["style"]] = stats.get(demo["style"], 0) + 1
        demos.append(demo)
    return demos, stats
