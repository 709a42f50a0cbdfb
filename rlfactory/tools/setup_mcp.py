"""What `rlfactory setup-mcp` checks, as a library: validate `mcpServers` files, start every server (each on its own,
so one broken server does not hide the others), list its tools, time start-up and one probe call, and check the
cache backend.

The probe calls a tool that declares readOnlyHint and idempotentHint, with the smallest arguments its schema allows
(so it has no side effects); a server without such a tool gets a `tools/list` round trip instead. A server is
healthy when it starts and answers the probe — a tool error from the minimal arguments still proves the round trip —
and, when it publishes the `rlfactory://health` resource (the AgentGym bridge does, for its upstream HTTP server),
that resource says ok.

Servers prepare themselves at start-up (e.g. the search server builds its index on first start), so "prepare" here
is starting them once; the embedded cache is launched when it is the configured backend.

Left out: printing (`rlfactory/cli/tools.py`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rlfactory.errors import ConfigError
from rlfactory.recipe.tools import CacheConfig
from rlfactory.starter import default_mcp_config
from rlfactory.tools.cache.base import CACHE_URL_ENV
from rlfactory.tools.cache.factory import make_cache
from rlfactory.tools.mcp_configs import ServerConfig, default_config_paths, load_mcp_configs
from rlfactory.tools.server import ToolServer
from rlfactory.tools.types import HEALTH_URI, ToolResult, ToolSpec

_PROBE_VALUES = {"string": "1", "integer": 1, "number": 1, "boolean": False, "array": [], "object": {},
                 "null": None}

logger = logging.getLogger(__name__)


@dataclass
class ProbeReport:
    tool: str | None
    """The tool called, or None for a plain tools/list round trip."""
    arguments: dict[str, Any] | None
    ok: bool
    latency_s: float
    detail: str = ""


@dataclass
class ServerReport:
    name: str
    source: str
    transport: str
    target: str
    ok: bool
    error: str | None = None
    startup_s: float | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    probe: ProbeReport | None = None
    health: str | None = None
    """What the server's `rlfactory://health` resource said (None: it publishes none)."""


@dataclass
class CacheReport:
    backend: str
    ok: bool
    detail: str = ""
    url: str | None = None


@dataclass
class SetupReport:
    configs: list[str]
    servers: list[ServerReport]
    cache: CacheReport | None
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self) -> list[str]:
        out = [f"server '{s.name}' ({s.source}): {s.error}" for s in self.servers if not s.ok]
        if self.cache is not None and not self.cache.ok:
            out.append(f"cache backend '{self.cache.backend}': {self.cache.detail}")
        return out


def resolve_config_paths(paths: Iterable[str | os.PathLike[str]], root: str | os.PathLike[str] = ".") -> list[Path]:
    """The given files; else `mcp_configs/default.json` under `root` (see `default_config_paths`); else (outside a
    project, e.g. in an empty folder after `pip install rlfactory`) the shipped `mcp_configs/default.json`."""
    given = [Path(p) for p in paths]
    if given:
        return given
    found = default_config_paths(root)
    if found:
        return found
    shipped = default_mcp_config()
    if shipped.is_file():
        logger.info("no mcp_configs/ here: using the shipped %s", shipped)
        return [shipped]
    raise ConfigError(f"no mcpServers files given and none found in {Path(root, 'mcp_configs')}; "
                      "pass one, e.g. `rlfactory setup-mcp mcp_configs/default.json`")


def probe_arguments(spec: ToolSpec) -> dict[str, Any] | None:
    """The smallest arguments the schema allows (required keys only), or None when they cannot be built."""
    schema = spec.input_schema or {}
    props = schema.get("properties") or {}
    args: dict[str, Any] = {}
    for key in schema.get("required") or ():
        prop = props.get(key)
        if not isinstance(prop, dict):
            return None
        if prop.get("enum"):
            args[key] = prop["enum"][0]
            continue
        kind = prop.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        if kind not in _PROBE_VALUES:
            return None
        value = _PROBE_VALUES[kind]
        minimum = prop.get("minimum", prop.get("exclusiveMinimum"))
        if kind in ("integer", "number") and isinstance(minimum, (int, float)) and value <= minimum:
            value = int(minimum) + 1
        args[key] = value
    return args


async def _probe(server: ToolServer) -> ProbeReport:
    for spec in server.tools:
        if spec.read_only and spec.idempotent and (args := probe_arguments(spec)) is not None:
            t0 = time.perf_counter()
            result: ToolResult = await server.call(spec.tool, args, spec.tool)
            latency = time.perf_counter() - t0
            ok = result.error_kind not in ("timeout", "server_error")
            return ProbeReport(spec.tool, args, ok, latency, result.text[:200])
    conn = server.connections[0]
    t0 = time.perf_counter()
    try:
        n = len(await asyncio.wait_for(conn.list_tools(), server.settings.tool_timeout_s))
        return ProbeReport(None, None, True, time.perf_counter() - t0, f"tools/list: {n} tools")
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return ProbeReport(None, None, False, time.perf_counter() - t0, f"tools/list failed: {e!r}")


async def server_health(server: ToolServer) -> tuple[bool, str | None]:
    """What a started server's `rlfactory://health` resource says: (ok, detail); (True, None) when it publishes
    none. Also used by `rlfactory envs doctor`."""
    conn = server.connections[0]
    timeout = server.settings.tool_timeout_s
    try:
        if HEALTH_URI not in await asyncio.wait_for(conn.resource_uris(), timeout):
            return True, None
        text = await asyncio.wait_for(conn.read_text_resource(HEALTH_URI), timeout)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return False, f"reading {HEALTH_URI} failed: {type(e).__name__}: {e}"
    try:
        data = json.loads(text)
        return bool(data["ok"]), str(data.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        return False, f"{HEALTH_URI} is not JSON with an `ok` field: {text[:200]!r}"


async def check_server(cfg: ServerConfig, *, probe: bool = True, extra_env: dict[str, str] | None = None
                       ) -> ServerReport:
    report = ServerReport(cfg.name, cfg.source, cfg.transport, cfg.describe(), ok=False)
    server = ToolServer(cfg, extra_env=extra_env)
    try:
        await server.start()
    except Exception as e:  # noqa: BLE001 - one broken server must not hide the others
        report.error = str(e)
        await server.close()
        return report
    try:
        report.startup_s = server.startup_s
        report.server_info = server.server_info
        report.tools = [{"name": t.tool, "description": t.description, "input_schema": t.input_schema,
                         "read_only": t.read_only, "idempotent": t.idempotent} for t in server.tools]
        if probe:
            report.probe = await _probe(server)
            if not report.probe.ok:
                report.error = f"probe call failed: {report.probe.detail}"
                return report
        ok, report.health = await server_health(server)
        if not ok:
            report.error = f"health check failed: {report.health}"
            return report
        report.ok = True
        return report
    finally:
        await server.close()


async def check_cache(cfg: CacheConfig, default_path: str | Path) -> tuple[CacheReport, Any]:
    """Start the configured cache and round-trip one value; returns the report and the started cache (or None)."""
    if cfg.backend == "none":
        return CacheReport("none", True, "caching disabled"), None
    cache = make_cache(cfg, default_path)
    try:
        await cache.start()
        if not await cache.ping():
            await cache.close()
            return CacheReport(cfg.backend, False, "backend does not answer (is Redis running at the URL?)"), None
        probe = ToolResult(name="setup-mcp", text="ok")
        await cache.set("setup-mcp-probe", probe, 60)
        hit = await cache.get("setup-mcp-probe")
        ok = hit is not None and hit.text == "ok"
        detail = "set/get round trip ok" if ok else "set/get round trip returned nothing"
        return CacheReport(cfg.backend, ok, detail, cache.url), cache
    except Exception as e:  # noqa: BLE001 - reported, not raised
        await cache.close()
        return CacheReport(cfg.backend, False, f"{type(e).__name__}: {e}"), None


async def run_setup(paths: Iterable[str | os.PathLike[str]], cache_cfg: CacheConfig | None = None, *,
                    cache_path: str | Path = ".rlfactory/tool_cache.rdb", probe: bool = True) -> SetupReport:
    """Validate the files (ConfigError on a bad file), check the cache, then check every server concurrently."""
    files = resolve_config_paths(paths)
    configs = load_mcp_configs(files)
    cache_report, cache = (None, None)
    env: dict[str, str] = {}
    if cache_cfg is not None:
        cache_report, cache = await check_cache(cache_cfg, cache_path)
        if cache is not None and cache.url:
            env[CACHE_URL_ENV] = cache.url
    try:
        servers = await asyncio.gather(*(check_server(c, probe=probe, extra_env=env) for c in configs.values()))
    finally:
        if cache is not None:
            await cache.close()
    ok = all(s.ok for s in servers) and (cache_report is None or cache_report.ok)
    return SetupReport([str(f) for f in files], list(servers), cache_report, ok)
