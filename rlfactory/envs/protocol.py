"""What a rollout loop does to drive stateful environment servers: the few rules, as pure functions.

1. `bind_episode`: every call to a tool whose input schema has `episode_id` gets the trajectory's id there (the
   policy never chooses it), so each trajectory has its own episode on servers shared by many trajectories.
2. `policy_schema` / `hide_episode_arg`: the tool schema shown to the policy, without `episode_id`.
3. `ends_episode`: a tool result whose structured content says `done: true` ends the trajectory.
4. `close_calls`: when a trajectory ends, close the episodes it opened (one `close` call per environment server it
   touched), so nothing waits for idle expiry.
5. `fork_calls`: copy a trajectory's episodes into another trajectory's (a branched group), on servers that list
   the loop-only `fork` tool.
6. `reset_call`: optionally open the task's episode before the first turn from the row's `env` metadata
   (`{"server": "textcraft", "task_id": 3}`), AgentGym-style, and show its observation in the prompt.

Works on rlfactory's own records (ToolSpec, ToolCall, ToolResult); imports nothing from the MCP SDK.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable

from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec

EPISODE_ARG = "episode_id"


def takes_episode(spec: ToolSpec | None) -> bool:
    return spec is not None and EPISODE_ARG in (spec.input_schema.get("properties") or {})


def bind_episode(call: ToolCall, spec: ToolSpec | None, episode_id: str) -> ToolCall:
    """The call with `episode_id` set to the trajectory's (whatever the policy wrote there)."""
    if not takes_episode(spec):
        return call
    return call.model_copy(update={"arguments": {**call.arguments, EPISODE_ARG: episode_id}})


def policy_schema(spec: ToolSpec) -> dict[str, Any]:
    """`spec.to_openai()` without the `episode_id` parameter (rlfactory fills it in)."""
    return hide_episode_arg(spec.to_openai())


def hide_episode_arg(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function schema without the `episode_id` parameter (a copy; `schema` is left as it was).
    `ChatFormat` applies it to every schema it renders, so no caller can show the field to the policy."""
    function = schema.get("function") if isinstance(schema, dict) else None
    params = function.get("parameters") if isinstance(function, dict) else None
    if not isinstance(params, dict) or EPISODE_ARG not in (params.get("properties") or {}):
        return schema
    params = copy.deepcopy(params)
    params["properties"].pop(EPISODE_ARG, None)
    if EPISODE_ARG in params.get("required", []):
        params["required"] = [r for r in params["required"] if r != EPISODE_ARG]
    return {**schema, "function": {**function, "parameters": params}}


def ends_episode(result: ToolResult) -> bool:
    """True when an environment said the episode is over (the trajectory should end after this tool turn)."""
    return bool(not result.is_error and isinstance(result.structured, dict) and result.structured.get("done"))


def close_calls(specs: Iterable[ToolSpec], used_servers: Iterable[str], episode_id: str) -> list[ToolCall]:
    """One `close` call per environment server in `used_servers` (servers with an episode-taking `close` tool)."""
    used = set(used_servers)
    return [ToolCall(name=s.name, arguments={EPISODE_ARG: episode_id})
            for s in specs if s.server in used and s.tool == "close" and takes_episode(s)]


def fork_tools(loop_specs: Iterable[ToolSpec]) -> dict[str, ToolSpec]:
    """The servers that can fork an episode, each with its loop-only `fork` tool."""
    return {s.server: s for s in loop_specs if s.tool == "fork" and takes_episode(s)}


def fork_calls(loop_specs: Iterable[ToolSpec], used_servers: Iterable[str], episode_id: str,
               into: str) -> list[ToolCall]:
    """One `fork` call per environment server in `used_servers`: copy episode `episode_id` into `into`. Raises
    ValueError naming a server that has no loop-only `fork` tool (it cannot branch)."""
    forks = fork_tools(loop_specs)
    missing = sorted(set(used_servers) - set(forks))
    if missing:
        raise ValueError(f"environment server(s) {', '.join(missing)} cannot fork an episode (no `fork` tool): "
                         f"a branched group needs every environment it plays to fork")
    return [ToolCall(name=forks[server].name, arguments={EPISODE_ARG: episode_id, "into": into})
            for server in sorted(set(used_servers))]


def task_env(task: dict[str, Any]) -> Any:
    """What a task row says of its environment: `task["env"]` or `task["metadata"]["env"]` (normally
    `{"server": name, "task_id": N}`), or None."""
    return task.get("env") or (task.get("metadata") or {}).get("env")


def reset_call(task: dict[str, Any], specs: Iterable[ToolSpec], episode_id: str) -> ToolCall | None:
    """The `reset` call that opens the task's episode, from `task_env(task)` (`{"server": name, "task_id": N}`);
    None when the task names no environment or the server has no `reset`."""
    env = task_env(task)
    if not isinstance(env, dict) or "server" not in env:
        return None
    spec = next((s for s in specs if s.server == env["server"] and s.tool == "reset"), None)
    if spec is None:
        return None
    return ToolCall(name=spec.name, arguments={"task_id": int(env.get("task_id", 0)), EPISODE_ARG: episode_id})
