"""Exceptions the library raises for user-facing problems.

Every message says what is wrong, where (file and field), and how to fix it. The CLI prints these without a
traceback; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import importlib
from typing import Any


class RLFactoryError(Exception):
    """Base class for errors caused by user input or the environment, not by a bug."""


class ConfigError(RLFactoryError, ValueError):
    """A configuration file (recipe, mcpServers JSON) or a field in it is invalid.

    `problems` holds every problem found, so a validator can report them all at once.
    """

    def __init__(self, message: str, *, file: str | None = None, problems: list[str] | None = None):
        self.file = file
        self.problems = problems or [message]
        prefix = f"{file}: " if file else ""
        if problems and len(problems) > 1:
            message = message + "\n" + "\n".join(f"  - {p}" for p in problems)
        super().__init__(prefix + message)


class ToolServerError(RLFactoryError):
    """A tool server could not be started or reached."""


class MissingExtra(RLFactoryError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def import_extra(module: str, feature: str, extra: str = "envs") -> Any:
    """Import `module`, or raise MissingExtra saying which `pip install 'rlfactory[EXTRA]'` brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"{feature} needs the `{module}` package, which the `{extra}` extra installs: "
                           f"pip install 'rlfactory[{extra}]'") from e
