"""`rlfactory envs doctor`: play one short episode end to end on each environment server of an mcpServers config
(health, reset, step, observe, close) and say which stage failed and what the server answered.

An environment server is one whose tools include `reset`, `step` and `close` taking `episode_id` (our own servers
and the AgentGym bridge). For the bridge, `health` is its upstream check (`rlfactory://health`), so a closed port,
an AgentGym error reply (`{"error": ...}`) or an empty first observation show up here before a run does.
Left out: printing (`rlfactory/cli/envs.py`).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfactory.envs.protocol import EPISODE_ARG, takes_episode
from rlfactory.errors import ConfigError
from rlfactory.starter import starter_root
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.mcp_configs import load_mcp_configs
from rlfactory.tools.setup_mcp import resolve_config_paths, server_health
from rlfactory.tools.types import ToolCall

# An action that ends no episode, by the kind of server its name says (else `inventory`).
SAFE_ACTIONS = {"textcraft": "inventory", "babyai": "check available actions", "sciworld": "look around",
                "webshop": "search[shoes]", "webarena": "scroll [down]", "web": "scroll [down]"}
# Servers whose tasks differ in kind by id: the doctor plays one episode per listed id (the web server's ids 0, 1, 2
# are a shop, a forum and a wiki task), else the one `--task-id`.
DOCTOR_TASKS = {"web": (0, 1, 2)}
DOCTOR_EPISODE = "rlfactory-doctor"


@dataclass
class Stage:
    name: str
    ok: bool
    latency_s: float
    detail: str


@dataclass
class EnvReport:
    server: str
    stages: list[Stage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.stages) and all(s.ok for s in self.stages)


def _ends(text: str, keep: int = 150) -> str:
    """The start and the end of a long text (TextCraft states its goal last, BabyAI first)."""
    return text if len(text) <= 2 * keep else f"{text[:keep]} … {text[-keep:]}"


def _doctor_tasks(server: str, task_id: int) -> tuple[int, ...]:
    name = server.lower()
    return next((ids for key, ids in DOCTOR_TASKS.items() if key == name or name.startswith(key + "_")), (task_id,))


def _safe_action(server: str) -> str:
    name = server.lower()
    return next((a for key, a in SAFE_ACTIONS.items() if key in name), "inventory")


async def _health(tools: Any, server: str) -> Stage | None:
    t0 = time.perf_counter()
    ok, detail = await server_health(tools.servers[server])
    return None if detail is None else Stage("health", ok, time.perf_counter() - t0, detail)


async def check_env(tools: Any, server: str, task_id: int = 0, action: str | None = None) -> EnvReport:
    """One episode on `server` (one per id of DOCTOR_TASKS for the servers listed there): health (when published),
    reset(task_id), step(action), observe, close."""
    report = EnvReport(server)
    health = await _health(tools, server)
    if health is not None:
        report.stages.append(health)
        if not health.ok:
            return report
    plan = [stage for tid in _doctor_tasks(server, task_id) for stage in (
        ("reset", {"task_id": tid}), ("step", {"action": action or _safe_action(server)}), ("observe", {}),
        ("close", {}))]
    for tool, args in plan:
        t0 = time.perf_counter()
        result = await tools.call(ToolCall(name=f"{server}.{tool}", arguments={**args, EPISODE_ARG: DOCTOR_EPISODE}))
        latency = time.perf_counter() - t0
        text = result.text.strip()
        ok = not result.is_error
        if ok and tool == "reset":
            observation = (result.structured or {}).get("observation", "")
            ok = bool(str(observation).strip())
            text = text if ok else f"empty first observation: {text[:200]}"
        report.stages.append(Stage(f"{tool}({', '.join(f'{k}={v!r}' for k, v in args.items())})", ok, latency,
                                   _ends(text)))
        if not ok and tool != "close":
            # A failed step still leaves an episode open on the server: close it, but report the failure.
            await tools.call(ToolCall(name=f"{server}.close", arguments={EPISODE_ARG: DOCTOR_EPISODE}))
            return report
    return report


def env_servers(specs: list[Any]) -> list[str]:
    """The servers among `specs` that serve episodes (reset and step tools taking `episode_id`)."""
    by_server: dict[str, set[str]] = {}
    for spec in specs:
        if takes_episode(spec):
            by_server.setdefault(spec.server, set()).add(spec.tool)
    return sorted(s for s, tools in by_server.items() if {"reset", "step", "close"} <= tools)


def _envs_config() -> Path:
    here = Path("mcp_configs") / "envs.json"
    return here if here.is_file() else starter_root() / "mcp_configs" / "envs.json"


async def run_doctor(configs: list[Path], only: list[str] | None = None, task_id: int = 0,
                     action: str | None = None) -> list[EnvReport]:
    """Check every environment server of `configs` (or those named in `only`) concurrently. Given no file: the
    environments' file, `mcp_configs/envs.json` (the project's, else the shipped one)."""
    configs = list(configs) or [_envs_config()]
    servers = load_mcp_configs(resolve_config_paths(configs))
    if only:
        missing = sorted(set(only) - set(servers))
        if missing:
            raise ConfigError(f"--server {', '.join(missing)}: not in the config (it has {', '.join(sorted(servers))})")
        servers = {k: v for k, v in servers.items() if k in only}
    async with ToolManager(servers) as tools:
        names = env_servers(tools.specs)
        if not names:
            raise ConfigError(f"no environment server (reset/step/close tools taking {EPISODE_ARG}) in "
                             f"{', '.join(str(c) for c in configs)}")
        return list(await asyncio.gather(*(check_env(tools, n, task_id, action) for n in names)))
