"""An environment's step as an MCP tool result: the text the policy reads, the structured fields the rollout loop and
the rewards read (`StepResult.to_structured`, with the episode's `state` hash), and the picture an environment with a
pixel view shows (a PNG `ImageContent` after the text); errors as error results, an infrastructure failure marked so.

Builds results only; which episode a call acts on and the tools themselves are `mcp_server.py`'s.
"""
from __future__ import annotations

import base64
import hashlib
from typing import Any

from mcp_types import CallToolResult, ImageContent, TextContent

from rlfactory.envs.episodes import Episode
from rlfactory.envs.types import EnvError, StepResult
from rlfactory.tools.types import INFRA_KEY


def tool_result(result: StepResult, ep: Episode[Any] | None, key: str, state: str | None = None,
                picture: bytes | None = None) -> CallToolResult:
    """A step as an MCP result: readable text for the policy, structured fields for the loop and rewards (`state`
    among them when the environment knows it, `env_state`), and what the agent sees as a PNG image after the text
    when the environment has a pixel view (`env_picture`)."""
    extra = {} if state is None else {"state": state}
    structured = result.to_structured(episode_id=key.split(":", 1)[1], steps=ep.steps if ep else 0, **extra)
    content: list[TextContent | ImageContent] = [TextContent(type="text", text=result.render())]
    if picture is not None:
        content.append(png_content(picture))
    return CallToolResult(content=content, structured_content=structured)


def png_content(png: bytes) -> ImageContent:
    """PNG bytes as an MCP image content block."""
    return ImageContent(type="image", data=base64.b64encode(png).decode("ascii"), mime_type="image/png")


def no_episode(key: str, start: str = "reset(task_id)") -> CallToolResult:
    """The answer to a call on an episode that is not open (`start`: the call that opens one)."""
    return tool_result(StepResult(observation=f"No episode is open: call {start} first."), None, key)


class EpisodeLost(EnvError):
    """The server itself closed the caller's episode (evicted to make room, or expired idle): the trajectory was cut
    short by the infrastructure, not by its own actions."""

    infra = True


def lost_episode(key: str, how: str, max_episodes: int, idle_timeout_s: float) -> CallToolResult:
    """The answer to a call on an episode the server closed itself (`how`: "evicted" or "expired", as
    `EpisodeRegistry.lost` says): an infrastructure failure naming the limit that closed it and how to raise it."""
    episode = key.split(":", 1)[-1]
    if how == "evicted":
        why = (f"episode {episode!r} was closed to make room: this server holds at most {max_episodes} open "
               f"episodes (--max-episodes). Raise --max-episodes, or run fewer trajectories at once "
               f"(rollout.max_concurrent_trajectories)")
    else:
        why = (f"episode {episode!r} was closed after {idle_timeout_s:g} s without a call (--idle-timeout-s). "
               f"Raise --idle-timeout-s if turns take longer")
    return error_result(EpisodeLost(why))


def env_state(env: Any) -> str | None:
    """The episode's state as the `state` field of a result's structured content: a short hash of
    `env.state_key()`, equal for equal states (what anchor-state turn credit groups turns by,
    rlfactory/algorithms/turn_credit.py); None for an environment without `state_key` or while it has no task."""
    key_of = getattr(env, "state_key", None)
    key = key_of() if key_of is not None else None
    return None if key is None else hashlib.sha1(key.encode()).hexdigest()[:16]


def env_picture(env: Any) -> bytes | None:
    """What the agent sees, as PNG bytes, for an environment with a pixel view (`picture()`, e.g. BabyAI served with
    `--view pixels`); None for a text-only environment or while it has no task."""
    picture = getattr(env, "picture", None)
    return picture() if picture is not None else None


def error_result(error: EnvError) -> CallToolResult:
    """An environment failure as an MCP error result: no step, nothing to score; an infrastructure failure says so
    in its structured content (`INFRA_KEY`)."""
    return CallToolResult(content=[TextContent(type="text", text=f"Environment error: {error}")], is_error=True,
                          structured_content={INFRA_KEY: True} if error.infra else None)
