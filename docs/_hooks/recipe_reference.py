"""The recipe reference page, walked from the pydantic models when the site is built, so it cannot drift from them.

Every field of `rlfactory.Recipe` and of every section under it (lists and maps of sections, and each variant of a
union such as `rollout.horizon`): its name, type with its bounds, default, unit (read off the name, which carries
it) and documentation (the attribute docstring under the field, which `Section` turns into the description).
"""
from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal, Union

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# a field name's last words -> its unit (the house style puts units in names); the first match wins
UNITS = [("_tokens_per_turn", "tokens per turn"), ("_per_s", "per second"), ("_s", "seconds"),
         ("_minutes", "minutes"), ("_bytes", "bytes"), ("_mb", "MiB"), ("_tokens", "tokens"), ("_steps", "steps"),
         ("_per_turn", "per turn"), ("_per_step", "per step"), ("_per_prompt", "per prompt"),
         ("_per_node", "per node")]
BOUNDS = {annotated_types.Ge: "≥", annotated_types.Gt: ">", annotated_types.Le: "≤", annotated_types.Lt: "<"}


def unit(name: str) -> str:
    return next((u for suffix, u in UNITS if name.endswith(suffix)), "")


def models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def bounds(metadata: list[Any]) -> str:
    out = []
    for m in metadata:
        for kind, sign in BOUNDS.items():
            if isinstance(m, kind):
                out.append(f"{sign} {getattr(m, next(iter(kind.__dataclass_fields__)))}")
        if isinstance(m, annotated_types.MinLen):
            out.append(f"at least {m.min_length} item{'s' if m.min_length != 1 else ''}")
    return ", ".join(out)


def yaml_value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


def default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else f"`{yaml_value(value)}`"
    if field.default is PydanticUndefined:
        return "**required**"
    return f"`{yaml_value(field.default)}`"


def cell(text: str) -> str:
    """One table cell: one line, and `|` escaped outside code spans (inside them the table parser skips it)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p.replace("|", r"\|") if i % 2 == 0 else p for i, p in enumerate(parts))


def anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "top"


def sections(model: type[BaseModel], path: str = "") -> list[tuple[str, str, type[BaseModel]]]:
    """(title, dotted path, model) for the model and each section under it, depth first in field order."""
    out = [(path or "top level", path, model)]
    for name, field in model.model_fields.items():
        inner = models_in(field.annotation)
        origin = typing.get_origin(field.annotation)
        sub = f"{path}.{name}" if path else name
        for m in inner:
            if origin is list or list in map(typing.get_origin, typing.get_args(field.annotation)):
                where = f"{sub}[]"
            elif origin is dict:
                where = f"{sub}.<server>" if name == "server_settings" else f"{sub}.<name>"
            else:
                where = sub
            if len(inner) > 1:  # a union of sections: say which variant (its `type` literal)
                tag = m.model_fields.get("type")
                variant = typing.get_args(tag.annotation)[0] if tag is not None else m.__name__
                out += [(f"{where} (type: {variant})" if t == where else t, p, mm)
                        for t, p, mm in sections(m, where)]
            else:
                out += sections(m, where)
    return out


def row(name: str, field: Any, section_links: dict[str, str], path: str) -> str:
    typ = type_name(field.annotation)
    inner = models_in(field.annotation)
    if inner:
        target = section_links.get(f"{path}.{name}" if path else name)
        typ = f"[{typ}](#{target})" if target else typ
    else:
        typ = f"`{typ}`"
    b = bounds(field.metadata)
    if b:
        typ += f", {b}"
    return f"| `{name}` | {cell(typ)} | {default(field)} | {unit(name)} | {cell(field.description or '')} |"


def render() -> str:
    from rlfactory.recipe.schema import Recipe

    found = sections(Recipe)
    links: dict[str, str] = {}
    for title, path, _ in found:  # the first section found under a field's path is where its link goes
        key = path.removesuffix("[]").split(".<")[0]
        links.setdefault(key, anchor(title))
    lines = [
        "# Recipe reference",
        "",
        "Every field of a recipe, generated from the pydantic models in `rlfactory/recipe/` each time the site is",
        "built: the documentation column is the docstring under the field in the code. Unknown keys are errors, and",
        "`--set dotted.path=value` (values are YAML) overrides any field, e.g. `--set trainer.total_steps=10`.",
        "A section's fields are written under its name in the YAML (`trainer: {total_steps: 10}`); `[]` marks a list",
        "of entries and `<server>` a map keyed by server name. The unit is read off the field's name, which carries",
        "it.",
        "",
        f"{sum(len(m.model_fields) for _, _, m in found)} fields in {len(found)} sections.",
        "",
    ]
    for title, path, model in found:
        heading = "Top level" if not path else f"`{title}`" if "(" not in title else \
            f"`{title.split(' (')[0]}` ({title.split(' (')[1]}"
        lines += [f"## {heading} {{ #{anchor(title)} }}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and model.__doc__ is not BaseModel.__doc__:
            lines += [" ".join(doc.split()), ""]
        lines += ["| field | type | default | unit | documentation |", "|---|---|---|---|---|"]
        lines += [row(name, f, links, path) for name, f in model.model_fields.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
