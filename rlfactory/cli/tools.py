"""CLI for the tool layer: `setup-mcp` (check every server and the cache), `tools list`, `tools call`, `new-tool`."""
from __future__ import annotations

import json
import keyword
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.table import Table

from rlfactory.cli.common import console, fail, run_async
from rlfactory.errors import ConfigError

tools_app = typer.Typer(help="List and call MCP tools by hand (debugging).", no_args_is_help=True)

_CONFIGS_HELP = ("mcpServers JSON files (default: mcp_configs/default.json here, or the shipped one outside a "
                 "project).")
_CONFIG_OPT_HELP = "An mcpServers JSON file (repeatable; the same as giving it as an argument)."


def register(app: typer.Typer) -> None:
    app.command("setup-mcp")(setup_mcp)
    app.command("new-tool")(new_tool)
    app.add_typer(tools_app, name="tools")


def setup_mcp(
    configs: Optional[List[Path]] = typer.Argument(None, help=_CONFIGS_HELP, show_default=False),
    config_opts: Optional[List[Path]] = typer.Option(None, "--config", "-c", help=_CONFIG_OPT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON report to stdout instead of a table."),
    cache_backend: str = typer.Option("embedded", help="Cache backend to check: embedded, redis or none."),
    cache_url: Optional[str] = typer.Option(None, help="Redis URL for --cache-backend redis."),
    cache_path: Optional[Path] = typer.Option(None, help="Embedded cache file (default: a temporary one)."),
    probe: bool = typer.Option(True, help="Time one read-only call per server (else a tools/list round trip)."),
) -> None:
    """Validate MCP configs, start every server, list its tools, time start-up and one call, check the cache."""
    from rlfactory.recipe.tools import CacheConfig  # here, not at the top: keeps `rlfactory --help` fast
    from rlfactory.tools.setup_mcp import run_setup

    try:
        cache_cfg = CacheConfig(backend=cache_backend, url=cache_url)  # type: ignore[arg-type]
    except ValueError as e:
        fail(f"--cache-backend/--cache-url: {e}")
    with tempfile.TemporaryDirectory(prefix="rlfactory-setup-") as tmp:
        path = cache_path or Path(tmp, "tool_cache.rdb")
        try:
            files = [*(configs or []), *(config_opts or [])]
            report = run_async(run_setup(files, cache_cfg, cache_path=path, probe=probe))
        except ConfigError as e:
            fail(str(e))
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        _print_setup(report)
    if not report.ok:
        fail("unhealthy:\n" + "\n".join(f"  - {p}" for p in report.problems()))


def _print_setup(report: Any) -> None:
    table = Table(title=f"MCP servers ({', '.join(report.configs)})", title_justify="left")
    for col in ("server", "transport", "status", "start-up", "probe call", "tools"):
        table.add_column(col, overflow="fold")
    for s in report.servers:
        status = "[green]ok[/green]" if s.ok else "[red]unhealthy[/red]"
        start = f"{s.startup_s:.2f} s" if s.startup_s is not None else "-"
        probe = "-"
        if s.probe is not None:
            what = s.probe.tool or "tools/list"
            probe = f"{what} {s.probe.latency_s * 1e3:.1f} ms"
        tools = ", ".join(t["name"] for t in s.tools) or (s.error or "")[:200]
        table.add_row(s.name, s.transport, status, start, probe, tools)
    console.print(table)
    for s in report.servers:
        for t in s.tools:
            props = t["input_schema"].get("properties", {})
            required = set(t["input_schema"].get("required", []))
            args = ", ".join(f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}" for k, v in props.items())
            flags = " [dim](read-only, idempotent: cached)[/dim]" if t["read_only"] and t["idempotent"] else ""
            console.print(f"  {s.name}.{t['name']}({args}){flags}", highlight=False)
    if report.cache is not None:
        c = report.cache
        mark = "[green]ok[/green]" if c.ok else "[red]failed[/red]"
        console.print(f"cache: {c.backend} {mark} — {c.detail}", highlight=False)
    if report.ok:
        console.print("[bold green]all servers healthy[/bold green]")


def _load_manager(configs: list[Path], only_server: str | None = None) -> Any:
    from rlfactory.tools.manager import ToolManager  # here, not at the top: keeps `rlfactory --help` fast
    from rlfactory.tools.mcp_configs import load_mcp_configs
    from rlfactory.tools.setup_mcp import resolve_config_paths

    servers = load_mcp_configs(resolve_config_paths(configs))
    if only_server is not None and only_server in servers:
        servers = {only_server: servers[only_server]}
    return ToolManager(servers)


@tools_app.command("list")
def tools_list(
    configs: Optional[List[Path]] = typer.Argument(None, help=_CONFIGS_HELP, show_default=False),
    config_opts: Optional[List[Path]] = typer.Option(None, "--config", "-c", help=_CONFIG_OPT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the tools' OpenAI schemas as JSON."),
) -> None:
    """List every tool as the model sees it (name, server, arguments, cache hints). Configs go as arguments or
    with `--config` / `-c`, as for `tools call`."""
    async def go() -> list[Any]:
        async with _load_manager([*(configs or []), *(config_opts or [])]) as tm:
            return tm.specs

    specs = run_async(go())
    if as_json:
        sys.stdout.write(json.dumps([s.to_openai() for s in specs], indent=2) + "\n")
        return
    table = Table()
    for col in ("tool", "server", "arguments", "cached", "description"):
        table.add_column(col, overflow="fold")
    for s in specs:
        props = s.input_schema.get("properties", {})
        table.add_row(s.name, s.server, ", ".join(props), "yes" if s.read_only and s.idempotent else "no",
                      (s.description or "").strip().split("\n")[0])
    console.print(table)


@tools_app.command("call")
def tools_call(
    tool: str = typer.Argument(..., help="SERVER.TOOL, or a bare tool name when it is unique."),
    arguments: str = typer.Argument("{}", help="Arguments as a JSON object."),
    configs: Optional[List[Path]] = typer.Option(None, "--config", "-c", help=_CONFIGS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
) -> None:
    """Call one tool by hand and print its result (exit 1 when the result is an error)."""
    from rlfactory.tools.types import ToolCall  # here, not at the top: keeps `rlfactory --help` fast

    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as e:
        fail(f"arguments: not valid JSON ({e.msg} at column {e.colno}); e.g. '{{\"expression\": \"2*21\"}}'")
    if not isinstance(args, dict):
        fail("arguments: must be a JSON object, e.g. '{\"expression\": \"2*21\"}'")
    server = tool.split(".", 1)[0] if "." in tool else None

    async def go() -> Any:
        async with _load_manager(configs or [], only_server=server) as tm:
            return await tm.call(ToolCall(name=tool, arguments=args))

    result = run_async(go())
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        console.print(result.text, highlight=False, markup=False)
        console.print(f"[dim]{result.server or '-'} · {result.latency_s * 1e3:.1f} ms"
                      f"{' · ' + str(result.error_kind) if result.is_error else ''}[/dim]", highlight=False)
    if result.is_error:
        raise typer.Exit(1)


_TOOL_TEMPLATE = '''"""{name}: an MCP tool server for rlfactory (scaffolded by `rlfactory new-tool {name}`).

A tool is a plain typed function: its signature and docstring are the schema the model sees. Declare
readOnlyHint/idempotentHint only when repeated calls with the same arguments give the same result without side
effects: that is what lets rlfactory cache the result.

Run by hand: `python envs/tools/{name}.py` (stdio). Check it: `rlfactory setup-mcp {config}`.
"""
from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

mcp = MCPServer("{name}", version="0.1.0")


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def {name}(text: str) -> str:
    """Return `text` reversed. Replace this with what your tool does; the model reads this docstring.

    Args:
        text: The text to reverse.
    """
    return text[::-1]


if __name__ == "__main__":
    mcp.run()
'''


def new_tool(
    name: str = typer.Argument(..., help="Tool name: lowercase letters, digits and underscores."),
    config: Path = typer.Option(Path("mcp_configs/default.json"), "--config", help="Config file to add it to."),
    tools_dir: Path = typer.Option(Path("envs/tools"), "--dir", help="Where tool servers live."),
) -> None:
    """Scaffold envs/tools/NAME.py (one typed, documented tool) and add it to an mcpServers config (the rest of
    that file is left as it is)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        fail(f"tool name {name!r}: use lowercase letters, digits and underscores, starting with a letter")
    from rlfactory.tools.mcp_config_edit import EMPTY_FILE, add_server  # here: keeps `rlfactory --help` fast

    script = tools_dir / f"{name}.py"
    if script.exists():
        fail(f"{script} already exists; pick another name or edit that file")
    config_dir = config.resolve().parent
    entry: dict[str, Any] = {"command": "python", "args": [os.path.relpath(script.resolve(), Path.cwd().resolve())]}
    cwd_rel = os.path.relpath(Path.cwd().resolve(), config_dir)
    if cwd_rel != ".":
        entry["cwd"] = cwd_rel
    # The config's new text is made before anything is written, so a config it cannot edit leaves no script behind.
    # Bytes, not text mode: text mode would turn the file's CRLF line ends into LF.
    try:
        old = config.read_bytes().decode("utf-8") if config.exists() else EMPTY_FILE
    except UnicodeDecodeError as e:
        fail(f"{config}: not UTF-8 text ({e.reason} at byte {e.start}); give another file with --config")
    try:
        new = add_server(old, name, entry, source=str(config))
    except ConfigError as e:
        fail(str(e))
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(_TOOL_TEMPLATE.format(name=name, config=config))
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_bytes(new.encode("utf-8"))
    console.print(f"created [bold]{script}[/bold] and added server '{name}' to {config}\n"
                  f"check it: rlfactory setup-mcp {config}", highlight=False)
