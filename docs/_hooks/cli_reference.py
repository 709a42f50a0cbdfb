"""The command-line reference page, read off the `rlfactory` command itself when the site is built.

It walks the typer app's command tree through the click-style objects typer builds (`get_command`, `list_commands`,
`get_params`, `get_help_record`): each command's help, usage, and every argument and option with the help and
default `rlfactory COMMAND --help` prints.
"""
from __future__ import annotations

from typing import Any


def _cell(text: str) -> str:
    parts = " ".join(text.split()).split("`")
    return "`".join(p.replace("|", r"\|") if i % 2 == 0 else p for i, p in enumerate(parts))


def _command(cmd: Any, ctx: Any, depth: int, lines: list[str]) -> None:
    path = ctx.command_path
    hashes = "#" * min(depth + 1, 4)
    lines += [f"{hashes} `{path}` {{ #{path.replace(' ', '-')} }}", ""]
    if cmd.help:
        lines += [" ".join(cmd.help.split()), ""]
    lines += ["```text", cmd.get_usage(ctx).strip(), "```", ""]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    records = [(p, p.get_help_record(ctx)) for p in params]
    records = [(p, r) for p, r in records if r is not None and r[0] != "--help"]
    if records:
        lines += ["| argument or option | help |", "|---|---|"]
        for p, (names, text) in records:
            if p.param_type_name == "argument":  # `folder <path>` -> `FOLDER <path>`, as the usage line names it
                head, _, rest = names.partition(" ")
                names = f"{head.upper()} {rest}".strip()
            lines.append(f"| `{names}` | {_cell(text)} |")
        lines.append("")
    if hasattr(cmd, "commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            _command(sub, sub.context_class(sub, info_name=name, parent=ctx), depth + 1, lines)


def render() -> str:
    import typer.main

    from rlfactory.cli.app import app

    root = typer.main.get_command(app)
    lines = [
        "# Command-line reference",
        "",
        "Every `rlfactory` command with its arguments and options, read off the command itself (`rlfactory/cli/`)",
        "each time the site is built: the same text `rlfactory COMMAND --help` prints. Where a command takes a",
        "recipe file, the name of a shipped recipe works too (`rlfactory recipes` lists them).",
        "",
    ]
    _command(root, root.context_class(root, info_name="rlfactory"), 1, lines)
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
