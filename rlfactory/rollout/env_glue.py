"""The AgentLoop's side of stateful environment servers: one `EpisodeBinding` per trajectory.

It applies the rules of `rlfactory/envs/protocol.py` to a live trajectory:
- every call to a tool that takes `episode_id` gets this trajectory's episode id (the policy never sees or picks it:
  `ChatFormat` renders the schemas without it), and the servers so touched are remembered;
- `open` runs the task's `reset` before the first turn when the row names `env: {server, task_id}`; the loop shows
  the observation to the policy as a user message in the prompt (part of prompt_ids, so token-exactness is untouched);
- `ended` says when a tool turn's structured content carried `done: true`;
- `fork` copies the trajectory's episodes into a branch's (a branched group), on the servers it touched;
- `close` ends the trajectory's episodes (one `close` per environment server touched), whatever the finish reason;
  those calls are not part of the trajectory and a failing close is logged, never raised.

Episode ids are the trajectory id plus a random suffix: the same trajectory id can recur (ids are derived from the
task and sample index, so consecutive steps, or verl workers numbering samples on their own, can reuse them), and
two live trajectories must never share an episode on a server they share.

Left out: the episode registry and expiry (server side, `rlfactory/envs/episodes.py`), rewards (`rewards/env.py`).
"""
from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any, Mapping

from rlfactory.envs.protocol import (
    bind_episode,
    close_calls,
    ends_episode,
    fork_calls,
    reset_call,
    takes_episode,
    task_env,
)
from rlfactory.tools.format import response_text
from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:
    from rlfactory.tools.manager import ToolManager

logger = logging.getLogger(__name__)
_WARNED: set[str] = set()


def new_episode_id(trajectory_id: str) -> str:
    """The trajectory id with a random suffix (readable in server logs, unique across batches and workers)."""
    return f"{trajectory_id}~{secrets.token_hex(4)}"


def reset_observation(result: ToolResult) -> str:
    """What the policy reads of a reset: the observation alone (the status line of a fresh episode, reward 0 and not
    done, tells it nothing); its images (a pixel view's picture) are `result.images`."""
    observation = (result.structured or {}).get("observation")
    return observation if isinstance(observation, str) else response_text(result)


class EpisodeBinding:
    """One trajectory's episodes on the environment servers it calls."""

    def __init__(self, specs: Mapping[str, ToolSpec], episode_id: str):
        """`specs`: every name the policy may call (bare and `server.tool`) mapped to its spec."""
        self.specs = specs
        self.episode_id = episode_id
        self.used_servers: set[str] = set()
        """Servers on which this trajectory holds (or held) an episode."""

    def bind(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls as sent to the servers: `episode_id` filled in where the tool takes one."""
        bound = []
        for call in calls:
            spec = self.specs.get(call.name)
            if takes_episode(spec):
                assert spec is not None
                self.used_servers.add(spec.server)
            bound.append(bind_episode(call, spec, self.episode_id))
        return bound

    @staticmethod
    def ended(results: list[ToolResult]) -> bool:
        """True when an environment said the episode is over."""
        return any(ends_episode(r) for r in results)

    async def open(self, task: dict[str, Any], tools: "ToolManager | None") -> ToolResult | None:
        """Reset the task's episode (`task["env"]`) and return the reset's result (`reset_observation` reads it), or
        None when the task names no environment the tools serve. Raises RuntimeError when the reset fails (the
        trajectory is then an error)."""
        if tools is None:
            return None
        call = reset_call(task, _unique(self.specs), self.episode_id)
        if call is None:
            env = task_env(task)
            server = repr(env.get("server") if isinstance(env, dict) else env)
            if env and server not in _WARNED:
                _WARNED.add(server)  # once per server name
                logger.warning("task %s names env %r, but no connected server has a `reset` tool for it; the policy "
                               "must open the episode itself", task.get("id"), env)
            return None
        self.used_servers.add(self.specs[call.name].server)
        (result,) = await tools.call_many([call])
        if result.is_error:
            raise RuntimeError(f"could not open the task's episode with {call.name}({call.arguments}): {result.text}")
        return result

    async def fork(self, tools: "ToolManager | None", episode_id: str) -> "EpisodeBinding":
        """A binding for another trajectory whose episodes are forks of this one's (same servers, new episode id
        `episode_id`). Raises RuntimeError when a server cannot fork or a fork fails."""
        twin = EpisodeBinding(self.specs, episode_id)
        if tools is None or not self.used_servers:
            return twin
        try:
            calls = fork_calls(tools.loop_specs, self.used_servers, self.episode_id, episode_id)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        twin.used_servers = set(self.used_servers)  # its forks are open from here on, failed or not: close them
        for r in await tools.call_many(calls):
            if r.is_error:
                raise RuntimeError(f"forking episode {self.episode_id} with {r.name} failed: {r.text}")
        return twin

    async def close(self, tools: "ToolManager | None") -> None:
        """Close every episode this trajectory opened. Never raises (a failed close leaves idle expiry to clean up)."""
        if tools is None or not self.used_servers:
            return
        calls = close_calls(_unique(self.specs), sorted(self.used_servers), self.episode_id)
        if not calls:
            return
        try:
            results = await tools.call_many(calls)
        except Exception as e:  # noqa: BLE001 - the batch goes on; the server's idle expiry frees the episode
            logger.warning("closing episode %s failed: %s: %s", self.episode_id, type(e).__name__, e)
            return
        for r in results:
            if r.is_error:
                logger.warning("closing episode %s with %s failed: %s", self.episode_id, r.name, r.text)


def _unique(specs: Mapping[str, ToolSpec]) -> list[ToolSpec]:
    """Each spec once (the loop's map holds every spec under two names)."""
    seen: dict[str, ToolSpec] = {}
    for spec in specs.values():
        seen.setdefault(spec.name, spec)
    return list(seen.values())
