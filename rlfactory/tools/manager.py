"""`ToolManager`: every configured MCP server behind one async interface for rollouts.

```python
async with ToolManager.from_files(["mcp_configs/default.json"], cache=make_cache(cfg, path)) as tools:
    prompt_tools = tools.openai_schemas()
    results = await tools.call_many([ToolCall(name="calculator", arguments={"expression": "2*21"})])
```

- Starts all servers concurrently (each under its own limits, see `server.py`) and discovers their tools. A tool is
  exposed under its bare name when unique across servers, else as `server.tool`; the qualified name always works.
- `call` / `call_many` never raise for the model's mistakes or a tool's failure: unknown tools, arguments that break
  the tool's input schema (required keys and top-level types, checked cheaply), timeouts and crashed servers all
  come back as `ToolResult(is_error=True, error_kind=...)` — content for the model.
- Results of tools the cache may keep (`ServerSettings.cache`: by default those declaring readOnlyHint and
  idempotentHint) are looked up and stored through the `ToolCache` protocol, with identical concurrent calls run
  once (single-flight).

Left out: parsing tool calls out of model text (`format.py`), the cache backends (`cache.py`), the SDK
(`mcp_client.py`), restarts (`server.py`). Tools are discovered once at start (a server's `tools/list_changed`
notification is not followed: a policy's tool set should not change mid-run). The cache is the caller's to start
and close: one cache usually outlives several managers.
"""
from __future__ import annotations

import asyncio
import difflib
import logging
import os
import time
from collections import Counter
from typing import Any, Iterable, Mapping

from rlfactory.errors import ToolServerError
from rlfactory.recipe.tools import ToolsConfig
from rlfactory.tools.cache.base import CACHE_NAMESPACE_ENV, CACHE_URL_ENV, ToolCache, cache_key
from rlfactory.tools.cache.single_flight import SingleFlight, cached_call
from rlfactory.tools.counters import count_result, empty_counters, tool_metrics
from rlfactory.tools.format import cap_output
from rlfactory.tools.mcp_client import error_result
from rlfactory.tools.mcp_configs import ServerConfig, load_mcp_configs, load_recipe_servers
from rlfactory.tools.server import ToolServer
from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec

log = logging.getLogger(__name__)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list, tuple),
    "object": (dict,), "null": (type(None),),
}


class _ArgCheck:
    """A cheap check of call arguments against a tool's input schema: required keys, unknown keys (when the schema
    forbids extras) and top-level JSON types. Deeper checks are the server's job (the SDK validates there too)."""

    __slots__ = ("required", "types", "closed", "names")

    def __init__(self, schema: dict[str, Any]):
        props = schema.get("properties") or {}
        self.required = tuple(schema.get("required") or ())
        self.closed = schema.get("additionalProperties") is False
        self.names = frozenset(props)
        self.types: dict[str, tuple[str, ...]] = {}
        for key, prop in props.items():
            kinds = _schema_types(prop)
            if kinds:
                self.types[key] = kinds

    def problem(self, args: Any) -> str | None:
        """None when the arguments pass, else what is wrong (for the model to read). On the hot path: plain loops."""
        if not isinstance(args, dict):
            return f"arguments must be a JSON object, got {type(args).__name__}"
        for k in self.required:
            if k not in args:
                missing = [k for k in self.required if k not in args]
                return f"missing required argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
        if not self.closed and not self.types:
            return None
        for key, value in args.items():
            if self.closed and key not in self.names:
                return f"unknown argument {key!r} (expected: {', '.join(sorted(self.names)) or 'none'})"
            kinds = self.types.get(key)
            if kinds is not None and not any(_is_type(value, k) for k in kinds):
                return f"argument {key!r} must be {' or '.join(kinds)}, got {_json_type(value)}"
        return None


def _schema_types(prop: Any) -> tuple[str, ...]:
    """The JSON types a property allows, or () when it cannot be told cheaply (refs, enums without a type, …)."""
    if not isinstance(prop, dict):
        return ()
    kind = prop.get("type")
    if isinstance(kind, str):
        return (kind,) if kind in _JSON_TYPES else ()
    if isinstance(kind, list):
        return tuple(kind) if all(k in _JSON_TYPES for k in kind) else ()
    options = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(options, list):
        kinds = [_schema_types(o) for o in options]
        return tuple(k for ks in kinds for k in ks) if all(kinds) else ()
    return ()


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES[kind])


def _json_type(value: Any) -> str:
    for name, types in _JSON_TYPES.items():
        if _is_type(value, name):
            return name
    return type(value).__name__


class _Route:
    """Everything the hot path needs about one exposed tool name, computed once at start-up."""

    __slots__ = ("spec", "server", "check", "cacheable", "ttl_s", "identity")

    def __init__(self, spec: ToolSpec, server: ToolServer, identity: str):
        self.spec = spec
        self.server = server
        self.check = _ArgCheck(spec.input_schema)
        mode = server.settings.cache
        self.cacheable = mode is True or (mode == "auto" and spec.read_only and spec.idempotent)
        self.ttl_s = server.settings.cache_ttl_s
        self.identity = identity


class ToolManager:
    """All configured servers behind `call` / `call_many`. Use as `async with ToolManager(...) as tools:`."""

    def __init__(self, servers: Mapping[str, ServerConfig], cache: ToolCache | None = None, *,
                 extra_env: Mapping[str, str] | None = None, origin: str | None = None):
        """`origin` labels the results this manager stores in the cache (`ToolResult.cache_origin`)."""
        self.configs = dict(servers)
        self.cache = cache
        self.origin = origin
        self.extra_env = dict(extra_env or {})
        self.servers: dict[str, ToolServer] = {}
        self._routes: dict[str, _Route] = {}
        self._specs: list[ToolSpec] = []
        self._loop_specs: list[ToolSpec] = []
        self._flight = SingleFlight()
        self._started = False
        self.reset_metrics()

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike[str]], cache: ToolCache | None = None,
                   **kwargs: Any) -> "ToolManager":
        """A manager for the servers of one or more `mcpServers` JSON files (validated now, started on enter)."""
        return cls(load_mcp_configs(paths), cache, **kwargs)

    @classmethod
    def from_recipe(cls, tools: ToolsConfig, cache: ToolCache | None = None, **kwargs: Any) -> "ToolManager":
        """A manager for the servers a recipe's `tools:` section names (`mcp_configs`, `servers`, `server_settings`)."""
        return cls(load_recipe_servers(tools), cache, **kwargs)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def __aenter__(self) -> "ToolManager":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start every server concurrently; raise ToolServerError naming each server that failed."""
        if self._started:
            return
        env = dict(self.extra_env)
        if self.cache is not None:
            await self.cache.start()
            if self.cache.url:  # lets `@redis_cache` inside servers share this cache
                env.setdefault(CACHE_URL_ENV, self.cache.url)
                namespace = getattr(self.cache, "namespace", None)
                if namespace:
                    env.setdefault(CACHE_NAMESPACE_ENV, str(namespace))
        self.servers = {name: ToolServer(cfg, extra_env=env) for name, cfg in self.configs.items()}
        outcomes = await asyncio.gather(*(s.start() for s in self.servers.values()), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            await self.close()
            for f in failures:
                if not isinstance(f, Exception):
                    raise f
            raise ToolServerError("\n".join(str(f) for f in failures))
        self._build_routes()
        self._started = True
        log.info("tool servers up: %s (%d tools)", ", ".join(self.servers), len(self._specs))

    def _build_routes(self) -> None:
        counts = Counter(spec.tool for s in self.servers.values() for spec in s.tools)
        self._routes, self._specs, self._loop_specs = {}, [], []
        for server in self.servers.values():
            info = server.server_info
            identity = f"{server.cfg.identity()}|{info.get('name', '')}|{info.get('version', '')}"
            for spec in server.tools:
                qualified = f"{server.name}.{spec.tool}"
                exposed = spec if counts[spec.tool] == 1 else spec.model_copy(update={"name": qualified})
                route = _Route(exposed, server, identity)
                self._routes[exposed.name] = route
                self._routes.setdefault(qualified, route)
                (self._loop_specs if exposed.loop_only else self._specs).append(exposed)

    async def close(self) -> None:
        """Stop every server; stdio server processes are gone when this returns."""
        self._started = False
        servers, self.servers = list(self.servers.values()), {}
        await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)

    # -- what the policy sees ----------------------------------------------------------------------------------------
    @property
    def specs(self) -> list[ToolSpec]:
        """Every tool the policy may call, named as the model must call it."""
        return list(self._specs)

    @property
    def loop_specs(self) -> list[ToolSpec]:
        """The tools only the rollout loop calls (`ToolSpec.loop_only`: an environment's `fork`), never shown to the
        policy; `call` runs them like any other."""
        return list(self._loop_specs)

    def openai_schemas(self) -> list[dict[str, Any]]:
        """Function-calling schemas for the chat template's system turn."""
        return [s.to_openai() for s in self._specs]

    def resolve(self, name: str) -> ToolSpec | None:
        route = self._routes.get(name)
        return route.spec if route else None

    # -- calls -------------------------------------------------------------------------------------------------------
    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure is an error result, never an exception."""
        if not self._started:
            raise RuntimeError("ToolManager is not started: use `async with ToolManager(...)` or await start()")
        t0 = time.perf_counter()
        route = self._routes.get(call.name)
        if route is None:
            result = self._unknown(call.name)
        elif (problem := route.check.problem(call.arguments)) is not None:
            result = error_result(call.name, route.server.name, "bad_arguments",
                                  f"Error: bad arguments for {call.name}: {problem}")
        elif route.cacheable and self.cache is not None:
            result = await self._call_cached(route, call)
        else:
            result = cap_output(await route.server.call(route.spec.tool, call.arguments, call.name,
                                                        idempotent=route.spec.idempotent),
                                route.server.settings.max_output_bytes)
        result.latency_s = time.perf_counter() - t0
        result.id = call.id
        self._count(result)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s -> %s%s (%.1f ms)", call.name, "error " if result.is_error else "",
                      result.error_kind or "ok", result.latency_s * 1e3)
        return result

    async def call_many(self, calls: Iterable[ToolCall]) -> list[ToolResult]:
        """Run calls concurrently (each server bounds its own concurrency); results keep the calls' order."""
        return list(await asyncio.gather(*(self.call(c) for c in calls)))

    async def _call_cached(self, route: _Route, call: ToolCall) -> ToolResult:
        try:
            key = cache_key(route.server.name, route.spec.tool, call.arguments, route.identity)
        except TypeError:  # arguments with no stable text cannot be keyed: just run the call
            return cap_output(await route.server.call(route.spec.tool, call.arguments, call.name,
                                                      idempotent=route.spec.idempotent),
                              route.server.settings.max_output_bytes)
        server, tool, args, name = route.server, route.spec.tool, call.arguments, call.name
        idempotent = route.spec.idempotent
        assert self.cache is not None

        async def run() -> ToolResult:
            fresh = cap_output(await server.call(tool, args, name, idempotent=idempotent),
                               server.settings.max_output_bytes)
            fresh.cache_origin = self.origin
            return fresh

        result = await cached_call(self.cache, self._flight, key, run, ttl_s=route.ttl_s)
        result.name = name  # a hit may have been stored under the qualified or the bare name
        return result

    def _unknown(self, name: str) -> ToolResult:
        names = sorted(s.name for s in self._specs)
        close = difflib.get_close_matches(name, names, n=1)
        if not close:  # compare bare tool names too: 'ad' should suggest 'tb.add'
            bare = {n.rsplit(".", 1)[-1]: n for n in reversed(names)}
            close = [bare[m] for m in difflib.get_close_matches(name.rsplit(".", 1)[-1], list(bare), n=1)]
        hint = f" Did you mean '{close[0]}'?" if close else ""
        shown = ", ".join(names[:20]) + (", …" if len(names) > 20 else "")
        return error_result(name, None, "unknown_tool", f"Error: unknown tool '{name}'.{hint} Available: {shown}")

    # -- metrics -----------------------------------------------------------------------------------------------------
    def _count(self, result: ToolResult) -> None:
        count_result(self._counts, result)

    def reset_metrics(self) -> None:
        """Zero the counters (e.g. at the start of each training step)."""
        self._counts = empty_counters()
        # Restarts BEGUN, not completed: a restart still in backoff/start-up when a batch's metrics are read would
        # otherwise finish before the next reset and be absorbed by this re-basing, counted in no batch at all.
        self._restarts_at_reset = self._restarts_begun()

    def _restarts_begun(self) -> int:
        return sum(s.restarts_begun for s in getattr(self, "servers", {}).values())

    def counters(self) -> dict[str, Any]:
        """The raw counts behind `metrics()`, since the last reset: additive, so counts of several managers (verl's
        agent-loop workers) or of several moments can be subtracted and summed, then turned into metrics with
        `tool_metrics`."""
        c = self._counts
        return {"calls": c["calls"], "errors": c["errors"], "hits": c["hits"], "latency_sum_s": c["latency_sum_s"],
                "infra_errors": c["infra_errors"], "retried": c["retried"],
                "images": c["images"], "image_bytes": c["image_bytes"],
                "restarts": max(0, self._restarts_begun() - self._restarts_at_reset),
                "error_kinds": dict(c["error_kinds"]),
                "per_server": {name: list(v) for name, v in c["per_server"].items()},
                "latency_hist": list(c["latency_hist"])}

    def metrics(self) -> dict[str, float]:
        """`tools/*` counters since the last reset: calls, errors (also by kind), cache hit rate, mean latency,
        restarts (servers lost since the reset, whether or not they are back yet), and per-server calls and errors."""
        return tool_metrics(self.counters())
