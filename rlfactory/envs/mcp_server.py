"""Serve an `Env` as a stateful MCP server: tools `reset`, `step`, `observe`, `close` over an `EpisodeRegistry`.

The one module of the library that imports the MCP *server* SDK (the client side lives in `rlfactory/tools`).

Which episode a call acts on, first match wins:
1. the `episode_id` argument (the AgentLoop fills it with the trajectory id: one episode per trajectory even though
   the ToolManager multiplexes many trajectories over one MCP session),
2. the request's `_meta["rlfactory/episode_id"]`,
3. the MCP session itself (a plain MCP client such as Claude Desktop gets one episode per connection); these
   episodes close when the session object goes away.

Every result carries structured content `{observation, reward, score, done, episode_id, task_id, steps}`; a tool
result with `done: true` ends the trajectory (the AgentLoop's rule) and `rewards/env.py` scores `score`. An `EnvError`
from the environment (e.g. its HTTP server is down or answered an error) is an error result with the message: a
failed `reset` before the first turn makes the trajectory an error, never an observation the policy reads.
A server built with `health=` publishes the `rlfactory://health` resource that `rlfactory setup-mcp` checks.
Environment tools are never cacheable (no readOnly / idempotent hints), and their configs say `"cache": false`.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import threading
import weakref
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from rlfactory.envs.episodes import Episode, EpisodeRegistry
from rlfactory.envs.types import Env, EnvError, StepResult
from rlfactory.tools.types import HEALTH_URI, INFRA_KEY

logger = logging.getLogger(__name__)

META_KEY = "rlfactory/episode_id"
STATS_URI = "rlfactory://episodes"
EPISODE_ID_DOC = ("Episode to act on. Filled in by rlfactory with the trajectory id; leave empty when calling by hand "
                  "(the connection's own episode is used).")
EpisodeId = Annotated[str, Field(description=EPISODE_ID_DOC)]
"""The `episode_id` parameter every episode tool takes (its description lands in the tool's input schema)."""
_ENV_TOOL = ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=False)


class EpisodeKeys:
    """Resolves the episode key of a request and closes a session's episodes when the session is collected."""

    def __init__(self, registry: EpisodeRegistry[Any]):
        self.registry = registry
        self._watched: set[int] = set()
        self._lock = threading.Lock()

    def key(self, episode_id: str, ctx: Context | None) -> str:
        if episode_id:
            return f"id:{episode_id}"
        if ctx is not None:
            try:
                rc = ctx.request_context
            except ValueError:
                rc = None
            if rc is not None:
                meta = rc.meta or {}
                meta_id = meta.get(META_KEY) if isinstance(meta, dict) else getattr(meta, META_KEY, None)
                if meta_id:
                    return f"id:{meta_id}"
                # mcp 2.x builds a ServerSession per request; the Connection behind it is what lives as long as
                # the client's connection (no public accessor yet).
                return self.session_key(getattr(rc.session, "_connection", rc.session))
        return "id:default"

    def session_key(self, connection: Any) -> str:
        """The key of a connection's own episode; its episodes close when `connection` is garbage-collected."""
        sid = id(connection)
        key = f"session:{sid}"
        with self._lock:
            if sid not in self._watched:
                self._watched.add(sid)
                try:
                    weakref.finalize(connection, self._session_gone, sid, key)
                except TypeError:  # not weak-referenceable: idle expiry still cleans up
                    pass
        return key

    def _session_gone(self, sid: int, key: str) -> None:
        with self._lock:
            self._watched.discard(sid)
        if self.registry.close(key):
            logger.info("MCP session ended: closed its episode")


def tool_result(result: StepResult, ep: Episode[Any] | None, key: str, **extra: Any) -> CallToolResult:
    """A step as an MCP result: readable text for the policy, structured fields for the loop and rewards."""
    structured = result.to_structured(episode_id=key.split(":", 1)[1], steps=ep.steps if ep else 0, **extra)
    structured["task_id"] = result.info.get("task_id")
    return CallToolResult(content=[TextContent(type="text", text=result.render())], structured_content=structured)


def error_result(error: EnvError) -> CallToolResult:
    """An environment failure as an MCP error result: no step, nothing to score; an infrastructure failure says so
    in its structured content (`INFRA_KEY`)."""
    return CallToolResult(content=[TextContent(type="text", text=f"Environment error: {error}")], is_error=True,
                          structured_content={INFRA_KEY: True} if error.infra else None)


class EnvServer:
    """An MCP server plus the episode registry behind its tools. `act` runs a function on the caller's episode."""

    def __init__(self, name: str, make_env: Callable[[], Env], *, instructions: str, max_episodes: int,
                 idle_timeout_s: float, inline: bool = False):
        self.inline = inline
        self.registry: EpisodeRegistry[Env] = EpisodeRegistry(make_env, max_episodes=max_episodes,
                                                              idle_timeout_s=idle_timeout_s)
        self.keys = EpisodeKeys(self.registry)
        self.server = MCPServer(name, instructions=instructions)

        # Open-episode counts, for operators and the leak test; a resource, so the policy never sees it as a tool.
        @self.server.resource(STATS_URI, mime_type="application/json")
        def episode_stats() -> str:
            return json.dumps(self.registry.stats())

    def add_tool(self, fn: Callable[..., CallToolResult], doc: str) -> None:
        """Register an episode tool; every such tool takes `episode_id` and is never cacheable."""
        fn.__doc__ = doc
        if self.inline:
            # CPU-bound pure-Python envs gain nothing from the SDK's worker threads (the GIL), only a thread hop per
            # call; an async wrapper runs them on the event loop. Blocking envs (a JVM, HTTP) keep the threads.
            sync_fn = fn

            @functools.wraps(sync_fn)
            async def fn(*args: Any, **kwargs: Any) -> CallToolResult:
                return sync_fn(*args, **kwargs)

        self.server.add_tool(fn, annotations=_ENV_TOOL, structured_output=False)

    def act(self, episode_id: str, ctx: Context | None, fn: Callable[[Any], StepResult], *,
            create: bool = False) -> CallToolResult:
        """Run `fn(env)` on the caller's episode under its lock (`create`: open the episode if needed)."""
        key = self.keys.key(episode_id, ctx)
        self.registry.expire()
        ep = self.registry.open(key) if create else self.registry.get(key)
        if ep is None:
            return tool_result(StepResult(observation="No episode is open: call reset(task_id) first."), None, key)
        with ep.lock:
            if create:
                ep.steps = 0
            try:
                result = fn(ep.env)
            except EnvError as e:
                return error_result(e)
            if not create:
                ep.steps += 1
        return tool_result(result, ep, key)

    def run(self) -> None:
        self.server.run()


def build_env_server(
    name: str,
    make_env: Callable[[], Env],
    *,
    instructions: str,
    reset_doc: str,
    step_doc: str | None,
    max_episodes: int = 256,
    idle_timeout_s: float = 900.0,
    inline: bool = False,
    health: Callable[[], tuple[bool, str]] | None = None,
) -> EnvServer:
    """An MCP server exposing `make_env()` episodes through reset/step/observe/close tools (`step_doc=None`: no
    generic `step` tool; the caller adds its own action tools with `EnvServer.add_tool`). `inline`: run the tools
    on the event loop (fast pure-Python envs) instead of worker threads (envs that block: a JVM, HTTP).
    `health() -> (ok, detail)`: whether what the server fronts is usable, published as `rlfactory://health`."""
    es = EnvServer(name, make_env, instructions=instructions, max_episodes=max_episodes,
                   idle_timeout_s=idle_timeout_s, inline=inline)
    if health is not None:
        @es.server.resource(HEALTH_URI, mime_type="application/json")
        def upstream_health() -> str:
            ok, detail = health()
            return json.dumps({"ok": ok, "detail": detail})

    def reset(task_id: Annotated[int, Field(description="Which task (any integer; the same id is the same task).")]
              = 0, episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.reset(task_id), create=True)

    def step(action: Annotated[str, Field(description="One text action.")], episode_id: EpisodeId = "",
             ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.step(action))

    def observe(episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        key = es.keys.key(episode_id, ctx)
        ep = es.registry.get(key)
        if ep is None:
            return tool_result(StepResult(observation="No episode is open: call reset(task_id) first."), None, key)
        with ep.lock:
            try:
                text = ep.env.observe()
            except EnvError as e:
                return error_result(e)
        return tool_result(StepResult(observation=text), ep, key)

    def close(episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        key = es.keys.key(episode_id, ctx)
        closed = es.registry.close(key)
        text = "Episode closed." if closed else "No open episode to close."
        # No reward/score here: a close recorded after the last step must not look like a zero-score step.
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content={"closed": closed, "done": True,
                                                  "episode_id": key.split(":", 1)[1]})

    es.add_tool(reset, reset_doc)
    if step_doc is not None:
        es.add_tool(step, step_doc)
    es.add_tool(observe, "Show the current observation again without acting.")
    es.add_tool(close, "End the episode and free its resources (rlfactory calls this when a trajectory ends).")
    return es


def server_args(description: str, max_episodes: int = 256, *, task_sets: tuple[str, ...] = (),
                argv: list[str] | None = None, extra: Callable[[argparse.ArgumentParser], None] | None = None
                ) -> argparse.Namespace:
    """Command-line options shared by the environment servers (`task_sets`: the `--task-set` choices, first is the
    default; `extra(parser)` adds a server's own options)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--max-episodes", type=int, default=max_episodes,
                   help="most episodes open at once; the least recently used is closed beyond it")
    p.add_argument("--idle-timeout-s", type=float, default=900.0, help="close an episode idle this long")
    if task_sets:
        p.add_argument("--task-set", choices=task_sets, default=task_sets[0],
                       help="which tasks the ids mean (agentgym: AgentGym's, see docs/environments.md)")
    if extra is not None:
        extra(p)
    return p.parse_args(argv)
