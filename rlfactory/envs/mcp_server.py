"""Serve an `Env` as a stateful MCP server: tools `reset`, `step`, `observe`, `close` over an `EpisodeRegistry`, and
`fork` (copy an episode into a new one) for environments that can (`forkable`), listed as loop-only so that the
policy never sees it.

The one module of the library that imports the MCP *server* SDK (the client side lives in `rlfactory/tools`).

Which episode a call acts on, first match wins:
1. the `episode_id` argument (the AgentLoop fills it with the trajectory id: one episode per trajectory even though
   the ToolManager multiplexes many trajectories over one MCP session),
2. the request's `_meta["rlfactory/episode_id"]`,
3. the MCP session itself (a plain MCP client such as Claude Desktop gets one episode per connection).
An episode belongs to the connection that reset it, whichever way it is named: when the connection goes away its
episodes close, and when the server process ends (stdin EOF, SIGTERM) every episode still open closes, so an
environment behind it (an AgentGym server, which never expires instances) keeps none of them. A process killed
with SIGKILL closes nothing.

Every result carries structured content `{observation, reward, score, done, episode_id, task_id, steps}` (and
`content_seed` from a reset of a seeded world, `state`, a hash equal for equal environment states, from an env with
`state_key()`); a tool result with `done: true` ends the trajectory (the AgentLoop's rule) and `rewards/env.py`
scores `score`. An `EnvError` from the environment (e.g. its HTTP server is down or answered an error) is an error
result with the message: a failed `reset` before the first turn makes the trajectory an error, never an observation
the policy reads.
A server built with `health=` publishes the `rlfactory://health` resource that `rlfactory setup-mcp` checks.
Environment tools are never cacheable (no readOnly / idempotent hints), and their configs say `"cache": false`.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import logging
import os
import signal
import threading
import weakref
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from rlfactory.envs.episodes import Episode, EpisodeRegistry
from rlfactory.envs.results import env_picture, env_state, error_result, lost_episode, no_episode, tool_result
from rlfactory.envs.types import Env, EnvError, StepResult
from rlfactory.tools.types import HEALTH_URI, LOOP_ONLY_META, MAX_EPISODES_META

logger = logging.getLogger(__name__)

META_KEY = "rlfactory/episode_id"
STATS_URI = "rlfactory://episodes"
EPISODE_ID_DOC = ("Episode to act on. Filled in by rlfactory with the trajectory id; leave empty when calling by hand "
                  "(the connection's own episode is used).")
EpisodeId = Annotated[str, Field(description=EPISODE_ID_DOC)]
"""The `episode_id` parameter every episode tool takes (its description lands in the tool's input schema)."""
_ENV_TOOL = ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=False)
FORK_DOC = ("Copy this episode into a new episode `into` that goes on from the same state on its own (rlfactory "
            "calls it to branch a group; the policy never sees it). Returns the copy's observation.")
SHUTDOWN_CLOSE_S = 2.0
"""Per request, when the server closes its episodes on the way out (an MCP client waits 2 s after closing stdin
before SIGTERM, and 2 s more before SIGKILL)."""
SHUTDOWN_S = 10.0
"""The most the way out waits for the episodes to close."""


class ServerStopping(EnvError):
    """The env server is shutting down: no new episode opens (an infrastructure failure, not the env's answer)."""

    infra = True


class EpisodeKeys:
    """Resolves the episode key of a request and closes a session's episodes when the session is collected."""

    def __init__(self, registry: EpisodeRegistry[Any]):
        self.registry = registry
        self._watched: set[int] = set()
        self._lock = threading.Lock()

    def key(self, episode_id: str, ctx: Context | None) -> str:
        if episode_id:
            return f"id:{episode_id}"
        rc = _request_context(ctx)
        if rc is not None:
            meta = rc.meta or {}
            meta_id = meta.get(META_KEY) if isinstance(meta, dict) else getattr(meta, META_KEY, None)
            if meta_id:
                return f"id:{meta_id}"
            return self.session_key(_connection(rc))
        return "id:default"

    def session_key(self, connection: Any) -> str:
        """The key of a connection's own episode; its episodes close when `connection` is garbage-collected."""
        return f"session:{self.watch(connection)}"

    def owner(self, ctx: Context | None) -> int | None:
        """The id of the request's connection (watched: its episodes close when it goes), or None."""
        rc = _request_context(ctx)
        return None if rc is None else self.watch(_connection(rc))

    def watch(self, connection: Any) -> int:
        sid = id(connection)
        with self._lock:
            if sid not in self._watched:
                self._watched.add(sid)
                try:
                    weakref.finalize(connection, self._session_gone, sid)
                except TypeError:  # not weak-referenceable: idle expiry and the process's end still clean up
                    pass
        return sid

    def _session_gone(self, sid: int) -> None:
        with self._lock:
            self._watched.discard(sid)
        keys = {f"session:{sid}"} | {ep.key for ep in self.registry if ep.owner == sid}
        closed = sum(self.registry.close(k) for k in sorted(keys))
        if closed:
            logger.info("MCP session ended: closed its %d episode(s)", closed)


def _request_context(ctx: Context | None) -> Any:
    if ctx is None:
        return None
    try:
        return ctx.request_context
    except ValueError:
        return None


def _connection(rc: Any) -> Any:
    # mcp 2.x builds a ServerSession per request; the Connection behind it is what lives as long as the client's
    # connection (no public accessor yet).
    return getattr(rc.session, "_connection", rc.session)


class EnvServer:
    """An MCP server plus the episode registry behind its tools. `act` runs a function on the caller's episode."""

    def __init__(self, name: str, make_env: Callable[[], Env], *, instructions: str, max_episodes: int,
                 idle_timeout_s: float, inline: bool = False):
        self.inline = inline
        self.registry: EpisodeRegistry[Env] = EpisodeRegistry(make_env, max_episodes=max_episodes,
                                                              idle_timeout_s=idle_timeout_s)
        self.keys = EpisodeKeys(self.registry)
        self.server = MCPServer(name, instructions=instructions)
        self._stop_lock = threading.Lock()
        self._stopper: threading.Thread | None = None
        self._stopped_count = 0
        self.start_call = "reset(task_id)"
        """The call that opens an episode, as the answer to a call on none names it."""
        self.on_shutdown: list[Callable[[], Any]] = []
        """Run after the episodes are closed on the way out (e.g. the AgentGym bridge closes its sentinels)."""

        # Open-episode counts, for operators and the leak test; a resource, so the policy never sees it as a tool.
        @self.server.resource(STATS_URI, mime_type="application/json")
        def episode_stats() -> str:
            return json.dumps(self.registry.stats())

    def add_tool(self, fn: Callable[..., CallToolResult], doc: str, *, loop_only: bool = False) -> None:
        """Register an episode tool; every such tool takes `episode_id` and is never cacheable. `loop_only`: listed
        with `_meta["rlfactory/loop_only"]`, so rlfactory's rollout loop calls it and never shows it to the policy."""
        fn.__doc__ = doc
        if self.inline:
            # CPU-bound pure-Python envs gain nothing from the SDK's worker threads (the GIL), only a thread hop per
            # call; an async wrapper runs them on the event loop. Blocking envs (a JVM, HTTP) keep the threads.
            sync_fn = fn

            @functools.wraps(sync_fn)
            async def fn(*args: Any, **kwargs: Any) -> CallToolResult:
                return sync_fn(*args, **kwargs)

        meta: dict[str, Any] = {MAX_EPISODES_META: self.registry.max_episodes}
        if loop_only:
            meta[LOOP_ONLY_META] = True
        self.server.add_tool(fn, annotations=_ENV_TOOL, structured_output=False, meta=meta)

    def missing(self, key: str) -> CallToolResult:
        """The answer to a call on no open episode: an infrastructure failure when this server closed it itself
        (evicted or expired), else the answer naming the call that opens one."""
        how = self.registry.lost(key)
        if how is None:
            return no_episode(key, self.start_call)
        return lost_episode(key, how, self.registry.max_episodes, self.registry.idle_timeout_s)

    def act(self, episode_id: str, ctx: Context | None, fn: Callable[[Any], StepResult], *,
            create: bool = False) -> CallToolResult:
        """Run `fn(env)` on the caller's episode under its lock (`create`: open the episode if needed)."""
        key = self.keys.key(episode_id, ctx)
        self.registry.expire()
        try:
            ep = self.registry.open(key) if create else self.registry.get(key)
        except RuntimeError as e:  # the registry is drained: the server is on its way out
            return error_result(ServerStopping(str(e)))
        if ep is None:
            return self.missing(key)
        with ep.lock:
            if create:
                ep.steps = 0
                ep.owner = self.keys.owner(ctx)
            try:
                result = fn(ep.env)
            except EnvError as e:
                return error_result(e)
            if not create:
                ep.steps += 1
            state, picture = env_state(ep.env), env_picture(ep.env)
        return tool_result(result, ep, key, state, picture)

    def look(self, episode_id: str, ctx: Context | None,
             answer: Callable[[Episode[Any], str], CallToolResult]) -> CallToolResult:
        """`answer(episode, key)` on the caller's open episode under its lock, taking no step (observe, a browser's
        screenshot); an `EnvError` is an error result, no open episode the answer that names the call opening one."""
        key = self.keys.key(episode_id, ctx)
        ep = self.registry.get(key)
        if ep is None:
            return self.missing(key)
        with ep.lock:
            try:
                return answer(ep, key)
            except EnvError as e:
                return error_result(e)

    def fork(self, episode_id: str, into: str, ctx: Context | None) -> CallToolResult:
        """Copy the caller's episode into a new episode named `into` (`Env.fork`), owned by the same connection;
        the copy's observation, score and state as the result."""
        key = self.keys.key(episode_id, ctx)
        if not into:
            return tool_result(StepResult(observation="fork needs `into`, the new episode's id."), None, key)
        into_key = self.keys.key(into, None)
        ep = self.registry.get(key)
        if ep is None:
            return self.missing(key)
        with ep.lock:
            try:
                env = ep.env.fork()
            except EnvError as e:
                return error_result(e)
            owner, steps = ep.owner, ep.steps
        result = StepResult(observation=env.observe(), score=getattr(env, "score", 0.0),
                            done=bool(getattr(env, "done", False)), info={"task_id": getattr(env, "task_id", None)})
        try:
            new = self.registry.adopt(into_key, env, owner=owner, steps=steps)
        except (KeyError, RuntimeError) as e:
            getattr(env, "close", lambda: None)()
            if isinstance(e, RuntimeError):
                return error_result(ServerStopping(str(e)))
            return error_result(EnvError(f"episode {into!r} is open already: fork into a new id"))
        return tool_result(result, new, into_key, env_state(env), env_picture(env))

    def run(self) -> None:
        """Serve over stdio until the client goes (stdin EOF) or SIGTERM; close every open episode then."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self.server.run()
        finally:
            self.shutdown()

    def _stop(self, episodes: list[Episode[Any]]) -> None:
        _close_episodes(episodes)
        for hook in self.on_shutdown:
            try:
                hook()
            except Exception:  # the way out goes on
                logger.exception("shutdown hook %r failed", hook)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Not a SystemExit: unwinding the event loop waits for its stdin reader, which only EOF ends.
        self.shutdown()
        os._exit(128 + signum)

    def shutdown(self, deadline_s: float = SHUTDOWN_S) -> int:
        """Close every open episode (in parallel, each request bounded by `SHUTDOWN_CLOSE_S`) and open no new one;
        waits at most `deadline_s`. Safe to call twice (the second call waits for the first). Returns how many
        episodes it took out."""
        with self._stop_lock:
            if self._stopper is None:
                episodes = self.registry.drain()
                self._stopper = threading.Thread(target=self._stop, args=(episodes,), daemon=True,
                                                 name="env-server-shutdown")
                self._stopper.start()
                self._stopped_count = len(episodes)
        self._stopper.join(deadline_s)
        if self._stopper.is_alive():
            logger.warning("shutting down: episodes still closing after %.0f s; leaving them", deadline_s)
        return self._stopped_count


def _close_episodes(episodes: list[Episode[Any]], workers: int = 16) -> None:
    """Close `episodes` on a few daemon threads, each waiting for its episode's call in flight (bounded)."""
    pending = list(episodes)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not pending:
                    return
                ep = pending.pop()
            if not ep.lock.acquire(timeout=SHUTDOWN_S / 2):
                logger.warning("shutting down: episode %r is still busy; not closed", ep.key)
                continue
            try:
                close = getattr(ep.env, "close", None)
                if close is not None and "timeout_s" in inspect.signature(close).parameters:
                    close(timeout_s=SHUTDOWN_CLOSE_S)  # an env behind a server (the AgentGym bridge): bounded
                elif close is not None:
                    close()
            except Exception:  # one broken env must not keep the others open
                logger.exception("closing episode %r on the way out failed", ep.key)
            finally:
                ep.lock.release()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(pending)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if episodes:
        logger.info("shut down: closed %d open episode(s)", len(episodes))


def build_env_server(
    name: str,
    make_env: Callable[[], Env],
    *,
    instructions: str,
    reset_doc: str | None,
    step_doc: str | None,
    max_episodes: int = 256,
    idle_timeout_s: float = 900.0,
    inline: bool = False,
    health: Callable[[], tuple[bool, str]] | None = None,
    forkable: bool = False,
) -> EnvServer:
    """An MCP server exposing `make_env()` episodes through reset/step/observe/close tools (`reset_doc=None` /
    `step_doc=None`: no generic `reset` / `step` tool; the caller adds its own with `EnvServer.add_tool`).
    `inline`: run the tools
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
        return es.look(episode_id, ctx, lambda ep, key: tool_result(
            StepResult(observation=ep.env.observe()), ep, key, picture=env_picture(ep.env)))

    def close(episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        key = es.keys.key(episode_id, ctx)
        closed = es.registry.close(key)
        text = "Episode closed." if closed else "No open episode to close."
        # No reward/score here: a close recorded after the last step must not look like a zero-score step.
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content={"closed": closed, "done": True,
                                                  "episode_id": key.split(":", 1)[1]})

    if reset_doc is not None:
        es.add_tool(reset, reset_doc)
    if step_doc is not None:
        es.add_tool(step, step_doc)
    es.add_tool(observe, "Show the current observation again without acting.")
    es.add_tool(close, "End the episode and free its resources (rlfactory calls this when a trajectory ends).")
    if forkable:
        def fork(into: Annotated[str, Field(description="The new episode's id.")], episode_id: EpisodeId = "",
                 ctx: Context | None = None) -> CallToolResult:
            return es.fork(episode_id, into, ctx)

        es.add_tool(fork, FORK_DOC, loop_only=True)
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
