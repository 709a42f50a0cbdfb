"""Helpers shared by CLI commands: one way to report a user error (no traceback) and to run a coroutine."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine, NoReturn

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a user-facing error (no traceback) and exit non-zero."""
    err_console.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine; library errors (RLFactoryError) become clean CLI errors."""
    from rlfactory.errors import RLFactoryError

    try:
        return asyncio.run(coro)
    except RLFactoryError as e:
        fail(str(e))
