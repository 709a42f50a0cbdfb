"""pydantic's validation errors as the messages rlfactory prints: `dotted.field: what is wrong`, with `did you mean`
for a misspelt key (or the list of known keys). Used for recipes, their sections and mcpServers settings alike."""
from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

REMOVED: dict[str, str] = {}
"""Recipe fields that existed once (dotted key -> what replaces them): a recipe naming one gets that as its error."""


def summary_line(problems: list[str]) -> str:
    """The head line of an error carrying several problems."""
    return problems[0] if len(problems) == 1 else f"{len(problems)} problems in the recipe:"


def format_validation_errors(e: ValidationError, root: type[BaseModel]) -> list[str]:
    """Every error of `e` as `dotted.path: message`, with `did you mean` for unknown keys."""
    return [describe_error(err, root) for err in e.errors(include_url=False)]


def describe_error(err: dict[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error as `dotted.path: message`; unknown keys get `did you mean` or the list of known keys."""
    loc = [str(x) for x in err.get("loc", ())]
    where = ".".join(loc) or "(top level)"
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        if where in REMOVED:
            return f"{where}: {REMOVED[where]}"
        known = fields_at(root, loc[:-1])
        hint = ""
        if known:
            close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"
        return f"{where}: unknown field{hint}"
    if kind == "missing":
        return f"{where}: required field is missing"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    given = err.get("input")
    if isinstance(given, (str, int, float, bool)):
        msg += f" (got {given!r})"
    return f"{where}: {msg}"


def fields_at(root: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names of the model reached by walking `loc` from `root` through nested models, lists and unions."""
    candidates: list[type[BaseModel]] = [root]
    for part in loc:
        nxt: list[type[BaseModel]] = []
        for model in candidates:
            if part in model.model_fields:
                nxt.extend(_models_in(model.model_fields[part].annotation))
        if not nxt:
            # A list index keeps the candidates; a union tag (`horizon.fixed`) narrows to that member.
            nxt = [m for m in candidates if _tag(m) == part] or (candidates if part.isdigit() else [])
        candidates = nxt
        if not candidates:
            return []
    names: list[str] = []
    for model in candidates:
        names += [n for n in model.model_fields if n not in names]
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _tag(model: type[BaseModel]) -> str | None:
    f = model.model_fields.get("type")
    return f.default if f is not None and isinstance(f.default, str) else None
