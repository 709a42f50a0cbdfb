"""Load `mcpServers` JSON files — the shape Claude Desktop and Cursor read — into `ServerConfig` records.

```json
{"mcpServers": {
    "calculator": {"command": "python", "args": ["-m", "rlfactory.envs.tools.calculator"],
                   "rlfactory": {"max_concurrency": 16, "tool_timeout_s": 10}},
    "remote":     {"url": "http://127.0.0.1:8931/mcp", "headers": {"Authorization": "Bearer …"}}
}}
```

Path rule (relative paths never depend on the directory rlfactory is started from):
- `cwd` resolves against the config file's directory; without `cwd` a stdio server runs IN the config file's
  directory. `args` are passed as written, so a relative script path in `args` is relative to that working directory.
- a `command` containing a `/` resolves against the working directory; a bare name is looked up on PATH.
- `"command": "python"` / `"python3"` runs the current interpreter (`sys.executable`), so tool servers get the
  project's virtual environment.

Every problem found in a file is reported in one `ConfigError` that names the file and the field
(`mcp_configs/x.json: mcpServers.search.comand: unknown key (did you mean 'command'?)`).

A command given no file reads `mcp_configs/default.json` alone (`default_config_paths`): the other shipped files are
alternatives a recipe names, and several define a server of the same name.

Left out: starting servers (`server.py` / `manager.py`) and SSE transport (deprecated in MCP; use streamable HTTP).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal
from urllib.parse import urlparse

from pydantic import ValidationError

from rlfactory.errors import ConfigError
from rlfactory.recipe.tools import ServerSettings, ToolsConfig

_STDIO_KEYS = {"command", "args", "env", "cwd"}
_HTTP_KEYS = {"url", "headers"}
# `type` and `disabled` appear in Cursor / VS Code snippets; accepting them lets those snippets work unchanged.
_COMMON_KEYS = {"type", "disabled", "rlfactory"}
_ALL_KEYS = _STDIO_KEYS | _HTTP_KEYS | _COMMON_KEYS
_TYPES_STDIO = {"stdio"}
_TYPES_HTTP = {"http", "streamable-http", "streamableHttp", "streamable_http"}
_PYTHON_NAMES = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}


@dataclass(frozen=True)
class ServerConfig:
    """One server, resolved: absolute paths, the interpreter substituted, settings parsed."""

    name: str
    source: str
    """The config file it came from (for error messages)."""
    transport: Literal["stdio", "http"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    settings: ServerSettings = field(default_factory=ServerSettings)

    def identity(self) -> str:
        """What the cache keys on besides the call: how the server is launched (a changed script path, argument
        or URL gives fresh cache entries)."""
        if self.transport == "http":
            return f"http {self.url}"
        return " ".join([Path(self.command or "").name, *self.args])

    def describe(self) -> str:
        if self.transport == "http":
            return str(self.url)
        return " ".join([self.command or "", *self.args])


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _unknown_key(key: str, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(sorted(allowed))})"
    return f"unknown key{hint}"


def _string_map(value: Any, where: str, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, dict):
        problems.append(f"{where}: must be an object of strings, got {type(value).__name__}")
        return {}
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, (str, int, float, bool)) or isinstance(v, bool):
            problems.append(f"{where}.{k}: must be a string, got {type(v).__name__}")
        else:
            out[str(k)] = str(v)
    return out


def _resolve_command(command: str, cwd: Path, env: dict[str, str]) -> str | None:
    """The executable to run, or None when it cannot be found."""
    if command in _PYTHON_NAMES:
        return sys.executable
    if "/" in command or os.sep in command:
        path = Path(command).expanduser()
        path = path if path.is_absolute() else cwd / path
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(command, path=env.get("PATH", os.environ.get("PATH")))


def _parse_settings(raw: Any, where: str, problems: list[str]) -> ServerSettings:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be an object, got {type(raw).__name__}")
        return ServerSettings()
    try:
        return ServerSettings.model_validate(raw)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                msg = _unknown_key(str(err["loc"][-1]), ServerSettings.model_fields)
            else:
                msg = err["msg"]
            problems.append(f"{where}.{loc}: {msg}")
        return ServerSettings()


def _parse_server(name: str, raw: Any, base: Path, source: str, problems: list[str]) -> ServerConfig | None:
    where = f"mcpServers.{name}"
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be an object with 'command' or 'url', got {type(raw).__name__}")
        return None
    before = len(problems)
    for key in raw:
        if key not in _ALL_KEYS:
            problems.append(f"{where}.{key}: {_unknown_key(key, _ALL_KEYS)}")
    settings = _parse_settings(raw.get("rlfactory", {}), f"{where}.rlfactory", problems)
    kind = raw.get("type")
    if kind is not None and kind not in _TYPES_STDIO | _TYPES_HTTP:
        hint = " (SSE is deprecated in MCP: serve streamable HTTP)" if kind == "sse" else ""
        problems.append(f"{where}.type: {kind!r} is not supported; use 'stdio' or 'http'{hint}")
    has_cmd, has_url = "command" in raw, "url" in raw
    if has_cmd and has_url:
        problems.append(f"{where}: has both 'command' and 'url'; keep one (command = stdio subprocess, url = HTTP)")
        return None
    if not has_cmd and not has_url:
        problems.append(f"{where}: needs 'command' (a stdio server to launch) or 'url' (a streamable-HTTP server)")
        return None
    if has_url:
        for key in _STDIO_KEYS & raw.keys():
            problems.append(f"{where}.{key}: only valid with 'command' (this server has a 'url')")
        url = raw["url"]
        parsed = urlparse(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            problems.append(f"{where}.url: {url!r} is not an http(s) URL like http://127.0.0.1:8000/mcp")
        headers = _string_map(raw.get("headers", {}), f"{where}.headers", problems)
        if len(problems) > before:
            return None
        return ServerConfig(name, source, "http", url=url, headers=headers, settings=settings)

    for key in _HTTP_KEYS & raw.keys():
        problems.append(f"{where}.{key}: only valid with 'url' (this server has a 'command')")
    command, args = raw["command"], raw.get("args", [])
    env = _string_map(raw.get("env", {}), f"{where}.env", problems)
    if not isinstance(command, str) or not command.strip():
        problems.append(f"{where}.command: must be a non-empty string")
        return None
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        problems.append(f"{where}.args: must be a list of strings")
        args = []
    args = [str(a) for a in args]
    cwd_raw = raw.get("cwd")
    cwd = base
    if cwd_raw is not None:
        if not isinstance(cwd_raw, str):
            problems.append(f"{where}.cwd: must be a string path")
        else:
            cwd = (base / Path(cwd_raw).expanduser()).resolve()
            if not cwd.is_dir():
                problems.append(f"{where}.cwd: directory {_display(cwd)} does not exist (relative to the config file)")
    exe = _resolve_command(command, cwd, env)
    if exe is None:
        where_looked = "relative to cwd" if "/" in command else "on PATH"
        problems.append(f"{where}.command: {command!r} not found {where_looked}; install it or give its full path")
    # A missing script is the commonest mistake (paths relative to the wrong directory): catch it here, not as a
    # server that dies at start-up.
    for i, arg in enumerate(args):
        if arg.endswith(".py") and not arg.startswith("-") and not (cwd / arg).is_file():
            problems.append(
                f"{where}.args[{i}]: file {arg!r} not found in {cwd} "
                "(relative args resolve against 'cwd', which defaults to the config file's directory)"
            )
    module = _run_module(args) if command in _PYTHON_NAMES else None  # another interpreter: its modules, not ours
    if module is not None and not _module_exists(module):
        problems.append(f"{where}.args: `python -m {module}`: no such module in this Python ({sys.executable}); "
                        f"install the package that provides it, or fix the name")
    if len(problems) > before or exe is None:
        return None
    return ServerConfig(name, source, "stdio", command=exe, args=tuple(args), env=env, cwd=str(cwd),
                        settings=settings)


def _run_module(args: list[str]) -> str | None:
    """The module of `python -m MODULE ...` (None when the args do not run one)."""
    for i, arg in enumerate(args):
        if arg == "-m":
            return args[i + 1] if i + 1 < len(args) else None
        if not arg.startswith("-"):
            return None  # a script path comes first: python runs that
    return None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def load_mcp_config(path: str | os.PathLike[str]) -> dict[str, ServerConfig]:
    """Parse one `mcpServers` file; raise one ConfigError listing every problem in it."""
    file = Path(path)
    shown = _display(file)
    if not file.is_file():
        raise ConfigError("file not found (pass an existing mcpServers JSON file, e.g. mcp_configs/default.json)",
                          file=shown)
    text = file.read_text()
    try:
        data = json.loads(text, object_pairs_hook=_Object.from_pairs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", file=shown) from None
    problems: list[str] = []
    if not isinstance(data, dict) or "mcpServers" not in data:
        raise ConfigError('top level must be an object with an "mcpServers" key: {"mcpServers": {NAME: {...}}}',
                          file=shown)
    for key in data:
        if key != "mcpServers" and key != "$schema":
            problems.append(f"{key}: {_unknown_key(key, ['mcpServers'])}")
    servers_raw = data["mcpServers"]
    if not isinstance(servers_raw, dict):
        raise ConfigError("mcpServers: must be an object mapping server names to their settings", file=shown)
    for name in getattr(servers_raw, "duplicates", ()):
        lines = _key_lines(text, name)
        where = f" (lines {', '.join(map(str, lines))})" if len(lines) > 1 else ""
        problems.append(f"mcpServers.{name}: defined more than once in this file{where}; JSON keeps only the last, "
                        f"so rename or remove the others")
    base = file.resolve().parent
    servers: dict[str, ServerConfig] = {}
    for name, raw in servers_raw.items():
        if not name or "." in name or any(c.isspace() for c in name):
            problems.append(f"mcpServers.{name}: server names must be non-empty, without dots or spaces "
                            "(tools are qualified as server.tool)")
            continue
        if isinstance(raw, dict) and raw.get("disabled") is True:
            continue
        cfg = _parse_server(name, raw, base, shown, problems)
        if cfg is not None:
            servers[name] = cfg
    if problems:
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems"
        raise ConfigError(head, file=shown, problems=problems)
    return servers


class _Object(dict):
    """A JSON object that remembers the keys it saw more than once (plain json keeps the last silently)."""

    duplicates: tuple[str, ...] = ()

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> "_Object":
        obj = cls()
        dups: list[str] = []
        for key, value in pairs:
            if key in obj and key not in dups:
                dups.append(key)
            obj[key] = value
        obj.duplicates = tuple(dups)
        return obj


def _key_lines(text: str, key: str) -> list[int]:
    """1-based lines where `"key":` appears (for naming duplicates)."""
    needle = re.compile(r'"' + re.escape(key) + r'"\s*:')
    return [text.count("\n", 0, m.start()) + 1 for m in needle.finditer(text)]


def load_mcp_configs(paths: Iterable[str | os.PathLike[str]]) -> dict[str, ServerConfig]:
    """Parse several files into one name -> ServerConfig map; a name defined twice is an error naming both files."""
    merged: dict[str, ServerConfig] = {}
    for path in paths:
        for name, cfg in load_mcp_config(path).items():
            if name in merged:
                raise ConfigError(
                    f"mcpServers.{name}: server name already defined in {merged[name].source}; rename one of them",
                    file=cfg.source,
                )
            merged[name] = cfg
    return merged


def load_recipe_servers(tools: ToolsConfig) -> dict[str, ServerConfig]:
    """The servers a recipe's `tools:` section asks for: the files' servers, only those named in `tools.servers`
    (when given), with `tools.server_settings` and `tools.server_args` applied. One ConfigError lists every problem."""
    servers = load_mcp_configs(tools.mcp_configs)
    problems: list[str] = []
    known = ", ".join(sorted(servers)) or "none"
    chosen = dict(servers)
    if tools.servers is not None:
        chosen = {}
        for name in tools.servers:
            if name in servers:
                chosen[name] = servers[name]
            else:
                close = difflib.get_close_matches(name, list(servers), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                problems.append(f"tools.servers: no server {name!r} in tools.mcp_configs ({hint}servers there: "
                                f"{known})")
    used = ", ".join(chosen) or "none"
    for name, patch in tools.server_settings.items():
        if name not in chosen:
            problems.append(f"tools.server_settings.{name}: no such server among those used ({used})")
            continue
        cfg = chosen[name]
        settings = cfg.settings.model_copy(update=patch.model_dump(exclude_none=True))
        chosen[name] = dataclasses.replace(cfg, settings=settings)
    for name, extra in tools.server_args.items():
        if name not in chosen:
            problems.append(f"tools.server_args.{name}: no such server among those used ({used})")
        elif chosen[name].transport != "stdio":
            problems.append(f"tools.server_args.{name}: {name} is reached at a url ({chosen[name].url}); only a "
                            "command's arguments can be added: remove it")
        else:
            chosen[name] = dataclasses.replace(chosen[name], args=(*chosen[name].args, *extra))
    if problems:
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems in tools"
        raise ConfigError(head, problems=problems)
    return chosen


DEFAULT_CONFIG = Path("mcp_configs", "default.json")
"""The file a command reads when it is given none (relative to the folder it runs in)."""


def default_config_paths(root: str | os.PathLike[str] = ".") -> list[Path]:
    """The files a command reads when it is given none: `mcp_configs/default.json` under `root`, alone.

    Not every `mcp_configs/*.json`: the shipped files are alternatives, not parts of one set (`envs.json`,
    `agentgym_tasks.json` and `textcraft_shuffled.json` each define a `textcraft` server, for different recipes),
    and a recipe or `-c FILE` names the one it means. Empty when `root` has no `mcp_configs/*.json` at all (the
    caller then uses the shipped default.json); a ConfigError naming the files when `mcp_configs/` has some but no
    default.json, since picking among them would be a guess."""
    folder = Path(root, "mcp_configs")
    default = Path(root, DEFAULT_CONFIG)
    if default.is_file():
        return [default]
    others = sorted(folder.glob("*.json"))
    if not others:
        return []
    shown = " ".join(f"-c {_display(p)}" for p in others[:4]) + (" ..." if len(others) > 4 else "")
    raise ConfigError(f"no mcpServers file given, and {_display(folder)} holds no default.json (the file read when "
                      f"none is given); name the ones to use, e.g. {shown}, or rename the usual one to "
                      "default.json")
