"""The `rlfactory` command line: one typer app, with each concern's commands registered from its own module here.

The command modules import only typer and rich at the top; anything heavy (torch, transformers, mcp, verl) is imported
inside the command that needs it, so that `rlfactory --help` and a mistyped command answer at once.
"""
from __future__ import annotations

import logging

import typer

from rlfactory.cli import dashboard, envs, init, rollout, serve, sft, tools, train

app = typer.Typer(
    name="rlfactory",
    help="Train LLM agents to use tools (MCP servers) with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


for _module in (init, tools, envs, train, rollout, sft, serve, dashboard):  # the order `rlfactory --help` lists them in
    _module.register(app)


if __name__ == "__main__":
    app()
